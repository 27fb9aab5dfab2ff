"""Copies of a prepared dataset: head -> workers over the private network, each checked before use.

By default data is prepared once on the head (`python -m model.prepare`) and fanned out head ->
workers, each copy checked against meta.json's sha256 before it replaces anything. Measured on the
sshd test nodes (13.3M tokens from a 49 MB jsonl): once on the head 6.1 s + copy and checksum to two
workers 0.8 s; one shard of three alone 3.0 s (each node still reads the whole source). So
`--sharded` (each node tokenizes its shard) is the faster choice for big corpora on machines with
their own cores; the default stays once-and-copy because it gives every node the same, checksummed
files, works for any later `--nodes`, and downloads a hub source once instead of N times.
"""

from __future__ import annotations

import shlex
import time

from launcher.console import TaskError, say
from launcher.remote import script
from launcher.session import Session
from launcher.setup.ready import distribute_keys
from launcher.site import REMOTE_ROOT, data_dir
from launcher.transport.cluster_ssh import SSH_DIR_SH

COPY_TIMEOUT_S = 6 * 3600
VERIFY_TIMEOUT_S = 3600


def verify_data_command(python: str, directory: str) -> str:
    """Check a dataset directory against its meta.json (launcher/remote/verify_data.py on stdin):
    prints "ok" and exits 0, or says what differs and exits 1."""
    return f"{python} - {directory}"


def splits_digest(meta: dict | None) -> tuple | None:
    """What identifies a preparation: each split's sha256 (None when there is no meta.json)."""
    if not meta or "splits" not in meta:
        return None
    return tuple(sorted((k, v.get("sha256")) for k, v in meta["splits"].items()))


def fanout_command(root: str, dataset: str, workers: list[str]) -> str:
    """Run on the head: stream data/<dataset> to each worker (by ssh alias) in parallel.

    Each copy lands in data/.incoming-<dataset> on the worker; verify_and_install_command moves it
    into place only after its checksums match."""
    remote_data = f"{REMOTE_ROOT}/data"
    incoming = f".incoming-{dataset}"
    receive = f"rm -rf {remote_data}/{incoming} && mkdir -p {remote_data}/{incoming} && tar -xf - -C {remote_data}/{incoming}"
    jobs = []
    for alias in workers:
        jobs.append(
            f"( tar -cf - -C {root}/data {shlex.quote(dataset)} | "
            f"ssh -F {SSH_DIR_SH}/config {shlex.quote(alias)} {shlex.quote(receive)} "
            f"|| echo {shlex.quote(alias)} >> \"$failed\" ) &"
        )
    return (
        'failed=$(mktemp); ' + " ".join(jobs) + " wait; "
        'if [ -s "$failed" ]; then echo "copy failed to: $(tr "\\n" " " < "$failed")" >&2; rm -f "$failed"; exit 1; fi; '
        'rm -f "$failed"'
    )


def verify_and_install_command(python: str, root: str, dataset: str) -> str:
    """Run on a worker with verify_data.py on stdin: check the incoming copy, then swap it in."""
    incoming = f"{root}/data/.incoming-{dataset}/{dataset}"
    target = f"{root}/data/{dataset}"
    return (
        f"{verify_data_command(python, incoming)} && rm -rf {target}.old && "
        f"{{ [ ! -d {target} ] || mv {target} {target}.old; }} && mv {incoming} {target} && "
        f"rm -rf {target}.old {root}/data/.incoming-{dataset}"
    )


def check_shards(session: Session, dataset: str) -> None:
    """Sharded data: every machine must hold a different shard of the same preparation."""
    hosts = session.hosts()
    metas = {n.index: session.report(n).data_meta or {} for n in hosts}
    head_meta = metas[session.head.index]
    shards = head_meta.get("shards", 1)
    indexes = [metas[n.index].get("shard_index") for n in hosts]
    same = all(m.get("shards") == shards and m.get("source") == head_meta.get("source") for m in metas.values())
    if not same or None in indexes or len(set(indexes)) != len(indexes):
        raise TaskError(f"data/{dataset} is sharded ({shards} shards) but the nodes do not hold one shard each: "
                        f"run `fab prepare-data --sharded --nodes {len(hosts)}` again")
    if shards != len(hosts):
        say(f"note: data/{dataset} has {shards} shards; these {len(hosts)} node(s) train on "
            f"shards {sorted(i for i in indexes if i is not None)} only")


def fan_out(session: Session, dataset: str, verify_existing: bool = False) -> None:
    """Copy data/<dataset> from the head to every worker whose copy differs, checksummed.

    The session's reports must be current for the dataset. verify_existing also re-reads the
    copies whose meta.json already matches (prepare-data does; a launch trusts meta.json to stay fast)."""
    hosts = session.hosts()
    if len(hosts) == 1:
        return
    want = splits_digest(session.report(hosts[0]).data_meta)
    if want is None:
        raise TaskError(f"data/{dataset} is not on {hosts[0].name}: run `fab prepare-data` first")
    stale = [n for n in hosts[1:] if splits_digest(session.report(n).data_meta) != want]
    verify = script("verify_data")
    if verify_existing:
        # A copy whose meta.json matches may still have a damaged file: check the bytes too.
        current = [n for n in hosts[1:] if n not in stale]
        checks = session.run_everywhere(current, lambda n, s: (n, s.run(
            verify_data_command(session.site.python, data_dir(s.root, dataset)), stdin=verify,
            timeout=VERIFY_TIMEOUT_S).ok))
        stale += [n for n, ok in checks if not ok]
    if not stale:
        say(f"data/{dataset} already matches on every node")
        return
    distribute_keys(session)
    started = time.monotonic()
    say(f"copying data/{dataset} from {hosts[0].name} to {', '.join(n.name for n in stale)} over the private network")
    head = session.shell(hosts[0])
    head.check(fanout_command(head.root, dataset, [n.name for n in stale]), "copying data to the workers",
               timeout=COPY_TIMEOUT_S)
    session.run_everywhere(stale, lambda n, s: s.check(
        verify_and_install_command(session.site.python, s.root, dataset),
        f"checking the copied data/{dataset} against meta.json", stdin=verify))
    say(f"data/{dataset} copied and checksummed on {len(stale)} node(s) in {time.monotonic() - started:.1f} s")
