"""Runs as `sglang.launch_server` on lab hosts (see the package docstring for how)."""

if __name__ == "__main__":
    from fleetspec_lab_engine.main import main

    main()
