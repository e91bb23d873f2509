"""DDTREE for sglang 0.5.23, as a plugin: no sglang file is replaced.

`register` is the `sglang.srt.plugins` entry point; sglang calls it in the launcher before
`prepare_server_args` and in every worker process. It registers the algorithm with
`SpeculativeAlgorithm.register` and hooks the parser so that the real `sglang serve` parser accepts
`--speculative-ddtree-*` (values land on ServerArgs as plain attributes, pickled to workers).
"""

from __future__ import annotations

_FLAGS = ("speculative_ddtree_budget", "speculative_ddtree_topk_cap", "speculative_ddtree_shadow_linear")


def _add_cli_args(result, parser):
    from sglang.srt.speculative.ddtree_config import add_ddtree_args

    add_ddtree_args(parser)


def _from_cli_args(server_args, cls, args):
    for name in _FLAGS:
        setattr(server_args, name, getattr(args, name, None))


def _validate(server_args):
    """Flags, budget and the hybrid guard (ddtree_config.check_ddtree_args), during resolution."""
    from sglang.srt.speculative.ddtree_config import check_ddtree_args

    check_ddtree_args(
        algorithm="DDTREE",
        budget=getattr(server_args, "speculative_ddtree_budget", None),
        topk_cap=getattr(server_args, "speculative_ddtree_topk_cap", None),
        shadow_linear=getattr(server_args, "speculative_ddtree_shadow_linear", False),
        model_path=getattr(server_args, "model_path", None),
    )


def _spec_class():
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    class DDTreeSpec(CustomSpecAlgo):
        """DFlash underneath: every DFlash code path (draft KV, hidden capture) applies."""

        def is_dflash(self) -> bool:
            return True

        def is_dflash_family(self) -> bool:
            return True

        def supports_target_verify_for_draft(self) -> bool:
            return True

        def handle_server_args(self, server_args) -> None:
            # What sglang's DFLASH handler settles, written as plain assignments (declared by sglang).
            server_args.speculative_num_steps = 1
            server_args.speculative_eagle_topk = 1
            if server_args.speculative_num_draft_tokens is None:
                server_args.speculative_num_draft_tokens = 16
            server_args.disable_overlap_schedule = True

    return DDTreeSpec


def _worker_factory(server_args):
    from fleetspec_ddtree.worker import DDTreeWorkerV2

    return DDTreeWorkerV2


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    if get_spec("DDTREE") is None:
        SpeculativeAlgorithm.register(
            "DDTREE", supports_overlap=False, validate_server_args=_validate, spec_class=_spec_class()
        )(_worker_factory)
    HookRegistry.register("sglang.srt.server_args.ServerArgs.add_cli_args", _add_cli_args, HookType.AFTER)
    HookRegistry.register("sglang.srt.server_args.ServerArgs.from_cli_args", _from_cli_args, HookType.AFTER)
