"""local_abi on this machine's real torch: the ABI a kernel built here records."""

from __future__ import annotations

import sys

import pytest
import torch

from fleetspec.build import kernel
from fleetspec.errors import UserError


def test_cpu_build_records_this_torch():
    abi = kernel.local_abi(False)
    assert (abi.cuda, abi.torch, abi.python_tag) == ("cpu", torch.__version__, "cp%d%d" % sys.version_info[:2])


@pytest.mark.skipif(torch.version.cuda is not None, reason="this torch is a CUDA build")
def test_cuda_build_on_a_cpu_torch_is_one_clear_line():
    """Called directly (build_kernel refuses earlier), a CUDA ABI is never recorded with cuda=None."""
    with pytest.raises(UserError, match="a CUDA kernel build needs a torch built with CUDA"):
        kernel.local_abi(True, arch="9.0")
