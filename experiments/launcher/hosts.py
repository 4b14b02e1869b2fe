"""The address and the ports of each host of an ssh or Slurm run.

Every process of a host listens on, and is reached at, one address of that host: the one named
for it (cluster.addresses "HOST=ADDRESS" or "HOST=INTERFACE", else cluster.interface), else
(ssh) the address ssh reached the host at, (Slurm) the node's route toward the launching node.
ZeroMQ listeners bind it and Gloo listens on it, so a host name that resolves to 127.0.1.1 on
its own host (Debian's /etc/hosts) does no harm. Ports are chosen on each host for each run
(bound to port 0 there: free, and not shared with a concurrent run), unless --base-port fixes
them."""
import fcntl
import ipaddress
import json
import os
import shlex
import socket
import struct
import subprocess
import time

from .common import LAUNCHER_PROTOCOL, REPO, UsageError, checkout_revision, is_loopback, warn
from .processes import communicate_checked

PROBE_TIMEOUT_S = 30.0
SIOCGIFADDR = 0x8915


def is_address(text):
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def named_address(plan, host):
    """What the config names for `host`: an address or an interface (cluster.addresses, else
    cluster.interface), or None."""
    for entry in plan.host_addresses:
        name, _, value = entry.partition("=")
        if name == host or name == host.split("@")[-1]:
            return value
    return plan.interface or None


def interface_address(name):
    """The IPv4 address of network interface `name` on this host; UsageError names the ones there."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            return socket.inet_ntoa(packed[20:24])
        except OSError as e:
            there = ", ".join(n for _, n in socket.if_nameindex())
            raise UsageError(f"{socket.gethostname()} has no IPv4 address on interface {name!r} ({e.strerror}); "
                             f"its interfaces: {there}")


def route_source(toward):
    """The address this host sends from to reach `toward` (no packet is sent)."""
    family = socket.AF_INET6 if ":" in toward else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((toward, 9))
        return s.getsockname()[0]


def own_address(named, toward=None):
    """This host's address for the run: `named` (an address, checked to be this host's, or an
    interface), else the route's source toward `toward`, else None."""
    if named:
        if not is_address(named):
            return interface_address(named)
        try:
            with socket.socket(socket.AF_INET6 if ":" in named else socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((named, 0))
        except OSError as e:
            raise UsageError(f"{named} is not an address of {socket.gethostname()} (cannot bind it: {e.strerror})")
        return named
    if toward:
        return route_source(toward)
    return None


def free_ports(address, count):
    """`count` distinct ports free on `address` now (held together while chosen)."""
    held = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
            held.append(s)
            s.bind((address, 0))
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def probe_main(named, ports, slurm=False):
    """`launch.py probe` (run over ssh on a host): prints {"hostname", "address", "ports"} as JSON.
    slurm (a task of the launcher's probe step): {"node", "ports"}, ports free on every address."""
    if slurm:
        print(json.dumps({"node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
                          "ports": free_ports("0.0.0.0", ports), "protocol": LAUNCHER_PROTOCOL}))
        return 0
    conn = os.environ.get("SSH_CONNECTION", "").split()
    reached_at = conn[2] if len(conn) == 4 else None
    address = own_address(named) or reached_at
    if not address:
        raise UsageError(f"{socket.gethostname()}: no address for this host: none named (cluster.addresses, "
                         "cluster.interface) and SSH_CONNECTION is not set (not started by ssh)")
    print(json.dumps({"hostname": socket.gethostname(), "address": address,
                      "ports": free_ports(address, ports) if ports else [],
                      "protocol": LAUNCHER_PROTOCOL, "revision": checkout_revision()}))
    return 0


def version_mismatch(host, protocol, revision):
    there = (f"launcher protocol {protocol}, revision {revision or 'unknown'}" if protocol is not None
             else "an older one, whose launch.py has no 'probe'")
    return (f"host {host} runs another version of pslab ({there}) than this host (protocol {LAUNCHER_PROTOCOL}, "
            f"revision {checkout_revision() or 'unknown'}): bring {REPO} on {host} to this revision and build it there")


def probe_hosts(plan, hosts, ports_per_host, ssh):
    """ssh: asks every host, all at once, for its address and `ports_per_host[host]` free ports.
    Returns {host: {"hostname", "address", "ports"}}; UsageError names a host that does not answer."""
    asked = {}
    for host in dict.fromkeys(hosts):
        cmd = ["experiments/launch.py", "probe", "--ports", str(ports_per_host.get(host, 0))]
        named = named_address(plan, host)
        if named:
            cmd += ["--address", named]
        remote = f"cd {shlex.quote(str(REPO))} && exec python3 {shlex.join(cmd)}"
        asked[host] = subprocess.Popen([*ssh, host, remote], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, start_new_session=True)
    found, deadline = {}, time.monotonic() + PROBE_TIMEOUT_S
    try:
        for host, p in asked.items():
            try:
                out, err = communicate_checked(p, max(0.1, deadline - time.monotonic()))  # (Ctrl-C heard)
            except subprocess.TimeoutExpired:
                raise UsageError(f"host {host} did not answer within {PROBE_TIMEOUT_S:g} s over ssh "
                                 f"(asked for its address and free ports)")
            if "invalid choice: 'probe'" in err:
                raise UsageError(version_mismatch(host, None, None))
            try:
                found[host] = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                raise UsageError(f"host {host}: cannot learn its address and free ports over ssh (exit {p.returncode}): "
                                 f"{(err or out).strip() or 'no output'}")
            if found[host].get("protocol") != LAUNCHER_PROTOCOL:
                raise UsageError(version_mismatch(host, found[host].get("protocol"), found[host].get("revision")))
    finally:
        for p in asked.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    here = checkout_revision()
    other = {h: f.get("revision") for h, f in found.items() if f.get("revision") and here and f.get("revision") != here}
    if other:
        warn(f"host(s) {', '.join(f'{h} (at {r})' for h, r in other.items())} run another revision of pslab than this one "
             f"({here}); the launchers agree (protocol {LAUNCHER_PROTOCOL}), but results may differ: bring {REPO} to {here} there")
    loop = sorted(h for h, f in found.items() if is_loopback(f["address"]))
    if loop and len(loop) < len(found):
        raise UsageError(f"host(s) {', '.join(loop)} were reached on a loopback address, the others "
                         f"({', '.join(h for h in found if h not in loop)}) are not: processes elsewhere could not reach "
                         f"them; name them by an address the other hosts reach, or set cluster.addresses")
    return found
