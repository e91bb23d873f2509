"""fleetspec lab engine stand-in: SGLang's server minus the GPU.

How it is hooked in. `fleetspec-lab-engine.pth` in the host venv's site-packages runs
`fleetspec_lab_engine.hook.install()` at interpreter start; that puts a meta-path finder first on
`sys.meta_path` which answers only for the module `sglang.launch_server` and points it at
`fleetspec_lab_engine/launch_server.py`. Everything else, the `sglang` package included, is found
the normal way. So the installed sglang stays byte-identical to its wheel (pip's RECORD checks
clean), and when a release puts an overlay copy of sglang first on PYTHONPATH the overlay's modules
are the ones imported: a meta-path finder is asked before the path finders, whichever folder
`sglang` itself came from. `FLEETSPEC_LAB_ENGINE=off` disables the redirect.

What runs. `main.main()`: read faults, load sglang plugins where the version has them, parse argv
with the host's real sglang parser (an unknown flag exits 2), resolve the algorithm with the real
`SpeculativeAlgorithm`, ask the real (patched) dispatch `create_worker` for the worker class, which
imports it (a broken patch or a missing non-GPU package fails here, at start, as in production),
wait the configured model-load time, then serve SGLang's HTTP API. Generation is real speculative
decoding over a deterministic target language model (`decode.py`, `model.py`): for DDTREE the tree
is built, masked, positioned and walked by the host's deployed `ddtree_utils`, wherever the
deployed worker would verify a tree.
"""
