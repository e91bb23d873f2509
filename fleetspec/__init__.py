"""fleetspec: deploy speculative-decoding changes to SGLang hosts, and roll them back."""

__version__ = "0.1.0"
