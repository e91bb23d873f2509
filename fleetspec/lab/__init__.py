"""The lab: real Debian containers (systemd-nspawn, sshd, real sglang) that replicate the fleet.

Nothing outside this package knows it is running in the lab.
"""
