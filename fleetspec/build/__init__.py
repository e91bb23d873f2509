"""Builders that run on this machine: patch sets, kernels (here, offline, or on a fleet host)."""
