"""`maxsim.__all__` is the public API: exactly the names a user may rely on. Changing it bumps
`version` in build.toml (the Hub branch v<version> that get_kernel(..., version=N) loads)."""

import types

import maxsim

PUBLIC = {
    "__version__", "maxsim", "maxsim_with_argmax", "maxsim_pairs", "maxsim_varlen",
    "maxsim_segments", "retrieve", "MaxSimScorer", "contrastive_loss", "contrastive_step",
    "quantize", "dequantize", "QuantizedTokens", "Corpus", "chamfer", "layers",
    "score_candidates_padded", "score_candidates_padded_with_argmax",
    "score_candidates_padded_train", "score_candidates_padded_reference",
    "score_candidates_padded_with_argmax_reference", "score_contrastive",
    "score_contrastive_with_argmax", "score_contrastive_train", "score_contrastive_reference",
    "score_contrastive_with_argmax_reference", "score_pairs_packed",
    "score_pairs_packed_with_argmax", "score_pairs_packed_train", "score_pairs_packed_reference",
    "score_pairs_packed_with_argmax_reference", "maxsim_reference", "maxsim_reference_with_argmax",
    "BACKENDS", "cpu_ops", "cuda_ops", "select_ops",
}


def test_all_lists_exactly_the_public_names():
    assert len(maxsim.__all__) == len(set(maxsim.__all__)), "a name listed twice"
    assert set(maxsim.__all__) == PUBLIC, "a public name changed: bump version in build.toml"
    for name in maxsim.__all__:
        assert hasattr(maxsim, name), name


def test_every_public_attribute_is_listed():
    """Names the package binds without an underscore are in __all__, except its submodules
    (imported for their side effects or reached by their full path)."""
    public = {
        name for name, value in vars(maxsim).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public <= set(maxsim.__all__), sorted(public - set(maxsim.__all__))


def test_layers_exports_the_hub_layers():
    assert maxsim.layers.__all__ == ["MaxSim", "MaxSimPairwise"]
