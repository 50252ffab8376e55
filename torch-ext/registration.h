// Registration macros for torch_binding.cpp, in the form kernel-builder generates them.
//
// Every build defines TORCH_EXTENSION_NAME to a name unique to its sources and flavour (for
// example _maxsim_cuda_1a2b3c4d5e), so two builds can live in one process. The ops register in a
// namespace of that name, and the shared library is importable as a Python module of that name.
#pragma once

#include <Python.h>
#include <torch/library.h>

#define _CONCAT(A, B) A##B
#define CONCAT(A, B) _CONCAT(A, B)

#define _STRINGIFY(A) #A
#define STRINGIFY(A) _STRINGIFY(A)

// TORCH_LIBRARY pastes its namespace argument as a token; these expand a macro name first.
#define TORCH_LIBRARY_EXPAND(NAME, MODULE) TORCH_LIBRARY(NAME, MODULE)
#define TORCH_LIBRARY_IMPL_EXPAND(NAME, DEVICE, MODULE) TORCH_LIBRARY_IMPL(NAME, DEVICE, MODULE)

// A Python module without methods: importing it only loads the library, whose static
// initialisers (the TORCH_LIBRARY blocks) register the ops. Uses the stable C API only (abi3).
#define REGISTER_EXTENSION(NAME)                                                             \
  PyMODINIT_FUNC CONCAT(PyInit_, NAME)(void) {                                               \
    static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, STRINGIFY(NAME), nullptr, 0, \
                                        nullptr};                                            \
    return PyModule_Create(&module);                                                         \
  }
