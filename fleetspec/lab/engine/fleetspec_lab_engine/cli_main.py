"""Runs as `sglang.cli.main` on lab hosts: the `sglang` console script's `sglang serve …`.

Real `sglang serve` builds ServerArgs, which needs an accelerator on 0.5.13.post1 and
huggingface_hub (absent from the lab's 0.5.23 venv). The stand-in instead takes the words the serve
entry point hands its parser (`--model-type X` removed; 0.5.23 on, a leading positional model
becomes --model-path) and starts from them; main() parses them with the host's real parser.
"""

import sys


def serve_words(words: list[str], positional: bool) -> list[str]:
    out, i = [], 0
    while i < len(words):
        if words[i] == "--model-type":
            i += 2
            continue
        if not words[i].startswith("--model-type="):
            out.append(words[i])
        i += 1
    if positional and out and not out[0].startswith("-"):
        out = ["--model-path", *out]
    return out


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] != "serve":
        sys.stderr.write("fleetspec lab stand-in: only `sglang serve` is served here\n")
        raise SystemExit(2)
    import sglang

    version = tuple(int(p) for p in sglang.__version__.split(".")[:3] if p.isdigit())
    from fleetspec_lab_engine.main import main as engine_main

    engine_main(serve_words(sys.argv[2:], positional=version >= (0, 5, 23)))
