"""Plain typed data loaded from the fleet root, validated at load time. No network I/O."""
