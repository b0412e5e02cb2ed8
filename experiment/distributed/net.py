"""Addresses, and keeping an unauthenticated Reverb server off the network.

Reverb has no authentication: anyone who reaches its port can read the
replay data, overwrite the policy weights, or fill the table. And Reverb
0.14 cannot bind one interface: its server always listens on `[::]:port`,
every IPv4 and IPv6 address of the machine (`reverb.Server` takes only a
port). So "bind 127.0.0.1" cannot be asked of Reverb; it can only be made
true from outside, by running the server where loopback is the only
interface: a private network namespace. `check_replay_exposure` therefore
lets the replay role start only if

  * its network namespace has no interface up but loopback (the launcher
    arranges this with `unshare --user --map-root-user --net`), or
  * the user passed `--bind_all_interfaces`, saying the network is trusted.
"""

import ipaddress
import os
import shutil
import socket
import subprocess

from core.errors import UserError

_IFF_UP = 0x1
NETNS_ENV = 'DISTRIBUTED_PRIVATE_NETNS'  # set inside the launcher's private namespace


def parse_address(address, *, flag='--replay_address'):
    """'host:port' -> (host, port), with a message a user can act on."""
    host, sep, port = (address or '').rpartition(':')
    host = host.strip('[]')
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"{flag}={address!r} is not HOST:PORT (e.g. localhost:8000).")
    return host, int(port)


def is_loopback(host):
    if host == 'localhost':
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposed_interfaces():
    """Names of the interfaces that are up, other than loopback, in this network namespace."""
    exposed = []
    for _, name in socket.if_nameindex():
        try:
            with open(f'/sys/class/net/{name}/flags') as flags:
                up = int(flags.read().strip(), 16) & _IFF_UP
        except OSError:
            up = True  # cannot tell: assume the worst
        if up and name != 'lo':
            exposed.append(name)
    return exposed


def check_replay_exposure(host, *, bind_all_interfaces):
    """Refuses to start an unauthenticated server reachable from a network, unless told to.

    Raises:
      UserError: the host is not loopback, or other interfaces are up, and
        `bind_all_interfaces` is False.
    """
    if bind_all_interfaces:
        return
    if not is_loopback(host):
        raise UserError(
            f"The replay server would serve {host}, which is not loopback: Reverb has no "
            "authentication, so pass --bind_all_interfaces only on a trusted network.")
    exposed = exposed_interfaces()
    if exposed:
        raise UserError(
            "Reverb 0.14 cannot listen on loopback only: its server always listens on every "
            f"interface ([::]:port), and this machine has {', '.join(exposed)} up. Run the "
            "replay role in a network namespace with only loopback (the launcher does: "
            "`unshare --user --map-root-user --net`), or pass --bind_all_interfaces to serve "
            "every interface on a trusted network (Reverb has no authentication).")


def private_namespace_command(argv):
    """`argv` wrapped to run in a new user + network namespace with loopback up, or None.

    Every process started inside shares the namespace, so roles reach each
    other on localhost and nothing outside can reach them.
    """
    unshare, ip = shutil.which('unshare'), shutil.which('ip')
    if not unshare or not ip:
        return None
    probe = subprocess.run([unshare, '--user', '--map-root-user', '--net', ip, 'link', 'set',
                            'lo', 'up'], capture_output=True, timeout=30, check=False)
    if probe.returncode != 0:
        return None
    script = f'{ip} link set lo up && exec "$@"'
    return [unshare, '--user', '--map-root-user', '--net', 'sh', '-c', script, 'sh', *argv]


def in_private_namespace():
    return os.environ.get(NETNS_ENV) == '1' and not exposed_interfaces()
