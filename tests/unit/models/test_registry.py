"""The one family table: ``loading.FAMILIES`` is ``layouts.LAYOUTS`` read by its adapters, every family of it has a
test model built from its stock config, and the bound tests run over all of them."""

from __future__ import annotations

import importlib

from attnsens.models import layouts, loading
from attnsens.models.hf import HFAdapter
from tests.unit.models.tiny_models import BOUNDED_FAMILIES, CONFIGS, model_type


def test_the_family_table_is_the_layout_table() -> None:
    for family, path in loading.OWN_ADAPTERS.items():  # an adapter of its own adds or reads its family's layout
        module_name, class_name = path.split(":")
        adapter = getattr(importlib.import_module(module_name), class_name)
        assert issubclass(adapter, HFAdapter) and family in layouts.LAYOUTS, family
    assert set(loading.FAMILIES) == set(layouts.LAYOUTS)
    layout_read = {f for f, path in loading.FAMILIES.items() if path == "attnsens.models.layouts:LayoutAdapter"}
    assert layout_read == set(layouts.LAYOUTS) - set(loading.OWN_ADAPTERS)


def test_every_family_of_the_table_has_a_test_model_the_bound_tests_run_on() -> None:
    tested = {model_type(family) for family in BOUNDED_FAMILIES}
    untested = sorted(set(loading.FAMILIES) - tested)
    assert not untested, f"families without a test model in tests/unit/models/tiny_models.py CONFIGS: {untested}"
    assert all(model_type(family) in loading.FAMILIES for family in BOUNDED_FAMILIES)
    assert set(BOUNDED_FAMILIES) <= set(CONFIGS)
