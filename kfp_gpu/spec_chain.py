"""The capacity chain of a spec (``capacity`` then ``fallback``): the rules :class:`kfp_gpu.spec.ProvisioningSpec`
applies at decoration time, kept apart so spec.py stays small. Pure; raises one-line InvalidSpec."""

from __future__ import annotations

from collections.abc import Sequence

from kfp_gpu.errors import InvalidSpec

CHAIN_BACKENDS = ("auto", "compute-class")  # the backends that follow a chain


def check(capacity: str, fallback: Sequence[str], *, provisioner: str, eks: bool, reservation: str,
          active_migration: bool) -> None:
    """Known types, no repeats, a reservation named where a rung consumes one, and only where a backend follows
    the chain (GKE's ComputeClass). Raises: InvalidSpec naming the field."""
    from kfp_gpu.spec import CapacityType  # spec.py calls this at validation time: no import cycle at load

    fallback = list(fallback)
    known = [c.value for c in CapacityType]
    for v in fallback:
        if v not in known:
            raise InvalidSpec("fallback", v, f"allowed: {', '.join(repr(c) for c in known)}")
    chain = [capacity, *fallback]
    if len(set(chain)) != len(chain):
        raise InvalidSpec("fallback", fallback, f"repeats a capacity type of the chain {chain}",
                          remediation="list each capacity type once, after capacity (e.g. capacity='reservation', "
                          "fallback=['flex-start', 'spot', 'on-demand'])")
    if fallback and provisioner not in CHAIN_BACKENDS:
        raise InvalidSpec("fallback", fallback, f"only the compute-class backend follows a capacity chain, not "
                          f"target.provisioner={provisioner!r}",
                          remediation="set target.provisioner='compute-class' (or 'auto'), or drop fallback")
    if fallback and eks:
        raise InvalidSpec("fallback", fallback, "a capacity chain needs a GKE ComputeClass; EKS has none",
                          remediation="drop fallback (Karpenter's NodePool tries spot then on-demand with "
                          "capacity='spot' and recovery.on_demand_after)")
    if "reservation" in fallback and not reservation:
        raise InvalidSpec("reservation", reservation, "fallback lists 'reservation' but names none",
                          remediation="set reservation='my-reservation' or drop 'reservation' from fallback")
    if fallback and reservation and "reservation" not in chain:
        raise InvalidSpec("reservation", reservation, f"no rule of the chain {chain} consumes a reservation",
                          remediation="add 'reservation' to capacity or fallback, or drop reservation=")
    if active_migration and not fallback:
        raise InvalidSpec("active_migration", True, "needs a capacity chain to migrate back along",
                          remediation="set fallback=[...] (compute-class backend) or active_migration=False")
