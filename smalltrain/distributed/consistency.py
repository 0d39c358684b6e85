"""Checking, before any training collective, that every rank runs with the same settings.

Ranks that disagree (another --epochs, --lr, batch size, data size, resume point ...) would diverge silently or
wait in collectives the others never enter; comparing a JSON of the settings once at start turns that into an
error on every rank that names each differing field and the ranks' values.
"""
import json


class SettingsMismatch(ValueError):
    """Raised on every rank alike (so no rank is left waiting): the ranks' settings differ."""

    same_on_every_rank = True


def check_same_settings(group, settings, what="settings"):
    """SettingsMismatch on every rank unless all ranks pass equal `settings` (a JSON-able dict)."""
    if group.world_size == 1:
        return
    everyone = [json.loads(s) for s in group.host.allgather_object(json.dumps(settings, sort_keys=True))]
    differing = []
    for key in sorted(set().union(*everyone)):
        values = [json.dumps(d.get(key)) for d in everyone]
        if len(set(values)) > 1:
            by_value = {}
            for rank, v in enumerate(values):
                by_value.setdefault(v, []).append(rank)
            differing.append(f"{key} ({'; '.join(f'{_ranks(rs)}: {v}' for v, rs in by_value.items())})")
    if differing:
        raise SettingsMismatch(f"the ranks' {what} differ: {', '.join(differing)}; every rank of a distributed "
                               f"job must run with the same {what}")


def _ranks(ranks):
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))
