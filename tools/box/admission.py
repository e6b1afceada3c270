"""Admission arithmetic of the box ledger: does work fit, and if not, who holds the memory and what frees it."""

from __future__ import annotations

from collections.abc import Iterable

from gpubox.errors import InvalidInputError
from gpubox.tools.box.schemas import Admission, Blocker, DeviceAccount, Holding


def admission(needs: dict[str, float], accounts: dict[str, DeviceAccount], held: Iterable[Holding]) -> Admission:
    """Would `needs` fit in `accounts`; if not, on which devices, and which calls would free enough."""
    holdings = list(held)
    rounded = {d: round(gb, 3) for d, gb in needs.items() if gb > 0}
    blockers: list[Blocker] = []
    for device, gb in needs.items():
        acct = accounts.get(device)
        if acct is None:
            raise InvalidInputError(f"no device '{device}' on this box; devices: {', '.join(sorted(accounts))}")
        if gb > acct.free_gb:
            blockers.append(
                Blocker(
                    device=device,
                    need_gb=round(gb, 3),
                    free_gb=acct.free_gb,
                    frees=frees(holdings, device, gb - acct.free_gb),
                )
            )
    if not blockers:
        where = ", ".join(f"{gb:.2f} GB on {d} ({accounts[d].free_gb:.2f} free)" for d, gb in needs.items())
        return Admission(fits=True, needs=rounded, reason=f"fits: {where}")
    return Admission(fits=False, needs=rounded, blockers=blockers, reason=why(blockers, accounts, holdings))


def frees(holdings: list[Holding], device: str, short_gb: float) -> list[str]:
    """Unpinned holders on `device`, largest first, until they would free `short_gb`."""
    out: list[str] = []
    freed = 0.0
    movable = sorted(
        (h for h in holdings if not h.pinned and h.devices.get(device, 0) > 0),
        key=lambda h: -h.devices[device],
    )
    for h in movable:
        if freed >= short_gb:
            break
        out.append(f"{h.frees_with} frees {h.devices[device]:.2f} GB")
        freed += h.devices[device]
    return out if freed >= short_gb else []


def why(blockers: list[Blocker], accounts: dict[str, DeviceAccount], holdings: list[Holding]) -> str:
    parts = []
    for b in blockers:
        a = accounts[b.device]
        held = [
            f"{h.owner} {h.devices[b.device]:.2f} GB" + (" (pinned)" if h.pinned else "")
            for h in holdings
            if h.devices.get(b.device, 0) > 0
        ]
        text = (
            f"{b.device}: needs {b.need_gb:.2f} GB, {b.free_gb:.2f} GB free of a {a.budget_gb:.2f} GB budget "
            f"(held by gpubox: {', '.join(held) or 'nothing'}; external {a.external_gb:.2f} GB)"
        )
        if b.frees:
            text += "; " + "; ".join(b.frees)
        else:
            text += (
                "; no unpinned work frees enough: free memory outside gpubox, raise memory_budget_gb, or "
                "ask for less (smaller model, context or batch)"
            )
        parts.append(text)
    return "does not fit. " + " | ".join(parts)
