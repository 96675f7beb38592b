"""MoE token dispatcher traffic: what one MoE layer moves over the expert-parallel group.

Per GPU, ``tokens`` local tokens of ``h`` activations (bf16) each pick ``top_k`` of ``E``
experts spread over ``ep`` ranks (``E/ep`` experts each). Forward dispatch and combine move the
same bytes in opposite directions (Megatron-Core moe/token_dispatcher.py):

- ``alltoall`` (MoEAlltoAllTokenDispatcher): every routed copy goes to its expert's rank:
  ``tokens x top_k x h`` per direction, scaled by the load on the busiest rank;
- ``allgather`` (MoEAllGatherTokenDispatcher): every rank gathers the whole group's tokens and
  keeps its experts' share; the combine is a reduce-scatter of the same ``ep x tokens x h``;
- ``flex`` (DeepEP / HybridEP, MoEFlexTokenDispatcher): a token goes once to each *rank* holding
  one of its experts, not once per expert: ``tokens x R x h`` with ``R`` the expected distinct
  ranks among ``top_k`` experts drawn without replacement,
  ``R = ep (1 - C(E - E/ep, k) / C(E, k))``, then copied to its local experts on arrival.
"""

from __future__ import annotations

BF16_BYTES = 2


def expected_ranks(top_k: int, num_experts: int, ep: int) -> float:
    """Expected distinct EP ranks a token's ``top_k`` experts live on (uniform routing)."""
    per_rank = num_experts / ep
    miss = 1.0  # probability that a given rank holds none of the token's experts
    for i in range(top_k):
        miss *= max(0.0, (num_experts - per_rank - i) / (num_experts - i))
    return ep * (1.0 - miss)


def rdma_message(tokens: float, hidden: int, top_k: int, num_experts: int, nodes: int,
                 imbalance: float) -> float:
    """Bytes one rank's DeepEP dispatch (or combine) sends over its NIC: each token once to each
    *remote node* holding one of its experts, then forwarded over NVLink inside that node
    (deepseek-ai/DeepEP@0297fc8 ``get_dispatch_layout`` counts ``num_tokens_per_rdma_rank``,
    tokens per node, beside ``num_tokens_per_rank``). With ``nodes`` nodes of ``E/nodes``
    experts each, a token reaches ``expected_ranks(top_k, E, nodes)`` distinct nodes, the
    other nodes' share ``(nodes - 1) / nodes`` of them remote (uniform routing; DeepSeek-V3's
    node-limited routing would reach fewer)."""
    if nodes <= 1:
        return 0.0
    reached = expected_ranks(top_k, num_experts, nodes)
    return tokens * reached * (nodes - 1) / nodes * hidden * BF16_BYTES * imbalance


def dispatch_message(dispatcher: str, tokens: float, hidden: int, top_k: int,
                     num_experts: int, ep: int, imbalance: float) -> tuple[str, str, float]:
    """(dispatch collective, combine collective, message bytes) of one MoE layer's pass.

    The message is what the collective moves as placer.cost.collectives sizes it: the send
    buffer of an all-to-all, the gathered tensor of an all-gather / reduce-scatter.
    """
    if dispatcher == "allgather":
        return "all_gather", "reduce_scatter", ep * tokens * hidden * BF16_BYTES
    copies = top_k if dispatcher == "alltoall" else expected_ranks(top_k, num_experts, ep)
    if dispatcher not in ("alltoall", "flex"):
        raise ValueError(f"unknown MoE dispatcher {dispatcher!r}")
    return "all_to_all", "all_to_all", tokens * copies * hidden * BF16_BYTES * imbalance
