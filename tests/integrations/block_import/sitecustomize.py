"""Makes one import fail for one importer, as a vLLM release that moved an
internal would: ``WCACHED_TEST_BLOCK_IMPORT="IMPORTER:MODULE"`` raises
ImportError when a module whose name starts with IMPORTER imports MODULE.
Put on PYTHONPATH by tests/integrations/test_vllm.py; every process of the
engine (its engine-core process too) loads it at start."""

import builtins
import os

_spec = os.environ.get("WCACHED_TEST_BLOCK_IMPORT", "")
if _spec:
    _importer, _, _module = _spec.partition(":")
    _real_import = builtins.__import__

    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        if name == _module and str((globals or {}).get("__name__", "")).startswith(_importer):
            raise ImportError(f"cannot import name from {_module!r} (blocked by the test)")
        return _real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = _import
