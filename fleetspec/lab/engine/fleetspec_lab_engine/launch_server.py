"""Runs as `sglang.launch_server` on lab hosts (see the package docstring for how)."""


def run_server(server_args):
    """`sglang serve` parses with sglang's real prepare_server_args and then calls
    sglang.launch_server.run_server: the stand-in starts from the words that entry point parsed
    (`--model-type X` removed, a leading positional model turned into --model-path)."""
    import sys

    from fleetspec_lab_engine.main import main

    words = list(sys.argv[sys.argv.index("serve") + 1:]) if "serve" in sys.argv else list(sys.argv[1:])
    out, i = [], 0
    while i < len(words):
        if words[i] == "--model-type":
            i += 2
            continue
        if not words[i].startswith("--model-type="):
            out.append(words[i])
        i += 1
    if out and not out[0].startswith("-"):
        out = ["--model-path", *out]
    main(out)


if __name__ == "__main__":
    from fleetspec_lab_engine.main import main

    main()
