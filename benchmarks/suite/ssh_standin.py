"""The `ssh` of an emulated cluster's hosts (`<state>/<cluster>/bin/ssh` runs `python -m
benchmarks.suite.ssh_standin CLUSTER ARGS…`): horovodrun and mpirun reach the other hosts through it as they
would over ssh. It takes ssh's options and `HOST COMMAND…`, and runs COMMAND on HOST in a shell, in the
host's namespace (benchmarks.suite.cluster); exit 255, as ssh's, when the host is not the cluster's or its
link is down.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from benchmarks.suite.cluster import Cluster, Host, link_state, load

SSH_ARG_OPTIONS = set("BbcDEeFIiJLlmOopQRSWw")
"""ssh's options that take an argument (OpenSSH 9): skipped, with their argument, to find the host."""


def agent_argv(c: Cluster, args: Sequence[str]) -> tuple[Host | None, str, str]:
    """The ssh stand-in's arguments (`[options] HOST [options] COMMAND…`) as the host, the command (one shell
    string, as ssh sends it) and the host name as given."""
    rest = list(args)
    given = ""
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            continue
        if arg.startswith("-") and len(arg) > 1:
            if arg[-1] in SSH_ARG_OPTIONS and len(arg) == 2 and rest:
                rest.pop(0)
            continue
        if not given:
            given = arg.split("@")[-1]  # user@host
            continue
        rest.insert(0, arg)
        break
    try:
        return c.host(given), " ".join(rest), given
    except KeyError:
        return None, " ".join(rest), given


def agent(name: str, args: Sequence[str]) -> int:
    """The `ssh` stand-in: run the command on the host, as ssh would (a shell, exit 255 when unreachable)."""
    c = load(name)
    if c is None:
        print(f"ssh: cluster {name} is not up", file=sys.stderr)
        return 255
    host, cmd, given = agent_argv(c, args)
    if host is None:
        print(f"ssh: Could not resolve hostname {given}: not a host of cluster {name}", file=sys.stderr)
        return 255
    if link_state(c, host) != "up":
        print(f"ssh: connect to host {given} port 22: Network is unreachable (its link is down)", file=sys.stderr)
        return 255
    os.execvp("ip", c.on(host, ["sh", "-c", cmd or "exec sh"]))


if __name__ == "__main__":
    sys.exit(agent(sys.argv[1], sys.argv[2:]))
