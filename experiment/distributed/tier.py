"""The replay tier of a distributed run: its shards' addresses, their counters, and where the
weights live.

A run has `distributed.settings.replay_shards` = K replay servers, named on the command line
as `--replay_address=HOST:PORT[,HOST:PORT...]` in shard order. Shard 0 also holds the
weights table, so "the replay server" of a one-shard run is simply shard 0. The run's
counters (windows stored, inserted, sampled) are the sums over the shards.

With one server, Reverb's own `SampleToInsertRatio` keeps the run's replay ratio. With
shards it cannot: a ratio per shard deadlocked across shards (collectors held on shards
the learner sampled little, the learner waiting on a shard no collector wrote to; measured
with DQN CartPole on 4 shards: a 10 s stall every few seconds). So each shard only has a
`MinSize` limiter, and the learner and the collectors keep the ratio over the whole buffer
themselves with Reverb's rule on the summed counters (`RatioGate`): with `diff = inserted
x samples_per_insert - sampled` and Reverb's offset `samples_per_insert x
min_size_to_sample`, the learner starts a call only while `diff >= offset - error_buffer`,
and a collector writes on only while `diff <= offset + error_buffer`. Both read the same
summed counters, so both cannot wait at once: no deadlock, even after a shard restored an
older checkpoint (its counters go back for both). While a shard is down that is no longer
so: each process counts the dead shard with the last reading *it* took, and the learner,
which reads less often, may hold an older one (a CI run deadlocked on 628 inserted / 4,688
sampled against the collectors' 676 / 4,704). So while any shard is down only the learner
keeps the ratio (it never samples ahead of the inserts it sees); collectors write on, and
wait again once every shard answers. The learner's call and its pipeline's
samples in flight, and each collector's writes between two weight pulls, may overshoot the
bounds by that much.
"""

import socket

import reverb

from buffers.reverb.shards import accepts_connections
from core.errors import UserError
from experiment.distributed import common, net

# Counters that add up over shards; `samples_per_insert` is the same on every shard.
_SUMMED = ('size', 'inserted', 'sampled', 'sample_blocked_ms', 'insert_blocked_ms',
           'max_diff', 'min_diff', 'min_size_to_sample')


def parse_addresses(text, shards):
    """`HOST:PORT[,HOST:PORT...]` -> the list of shard addresses, checked against K.

    Raises:
      UserError: a malformed address, or not exactly `shards` of them.
    """
    addresses = [part.strip() for part in (text or '').split(',') if part.strip()]
    for address in addresses:
        net.parse_address(address)
    if len(addresses) != shards:
        raise UserError(
            f"--replay_address names {len(addresses)} replay server(s) but "
            f"distributed.settings.replay_shards={shards}: give one HOST:PORT per shard, "
            "comma-separated, in shard order.")
    return addresses


def is_this_host(host):
    """Whether `host` names this machine (loopback, its host name or its FQDN)."""
    if net.is_loopback(host):
        return True
    names = {socket.gethostname(), socket.getfqdn()}
    return host in names or host.split('.')[0] in {name.split('.')[0] for name in names}


class ReplayTier:
    """The K replay shards of a run, every call bounded by `timeout_s`."""

    def __init__(self, addresses, *, timeout_s, settings=None):
        """`settings` (the run's `Settings`) give the whole buffer's ratio bounds that a
        sharded run's counters report (Reverb's are per shard)."""
        self.addresses = list(addresses)
        self._settings = settings
        self._timeout_s = timeout_s
        self._clients = [reverb.Client(address) for address in self.addresses]
        self._last = {}  # {shard: its last answered counters}
        self._down = set()  # shards that did not answer at their last read

    @property
    def num_shards(self):
        return len(self.addresses)

    @property
    def weights_address(self):
        """The shard that holds the weights table (shard 0)."""
        return self.addresses[0]

    def describe(self):
        """'the replay server at A', or 'the replay shards at A, B'."""
        if self.num_shards == 1:
            return f'the replay server at {self.addresses[0]}'
        return f"the replay shards at {', '.join(self.addresses)}"

    def hosts(self):
        return [net.parse_address(address)[0] for address in self.addresses]

    def local_shards(self):
        """Which shards run on this machine (a collector writes to those first)."""
        return [is_this_host(host) for host in self.hosts()]

    def shard_counters(self):
        """Each shard's counters (`common.replay_counters`), or None for a shard that is down."""
        counters = []
        for index, client in enumerate(self._clients):
            if index in self._down and not accepts_connections(self.addresses[index]):
                counters.append(None)  # still down, known without waiting a deadline
                continue
            try:
                value = common.replay_counters(client.server_info(max(1, int(self._timeout_s))))
            except (RuntimeError, reverb.errors.ReverbError):
                value = None
                self._down.add(index)
            else:
                self._last[index] = value
                self._down.discard(index)
            counters.append(value)
        return counters

    def counters(self):
        """The run's counters, summed over the shards.

        A shard that is down counts with what it last reported (its windows come back from
        its checkpoint when it restarts), so one shard's outage stalls nobody; until every
        shard has answered once this raises, for the caller's retry. With one shard,
        exactly that shard's counters.
        """
        if self.num_shards == 1:
            return common.replay_counters(
                self._clients[0].server_info(max(1, int(self._timeout_s))))
        down = sum(value is None for value in self.shard_counters())
        missing = [self.addresses[k] for k in range(self.num_shards) if k not in self._last]
        if missing:
            raise reverb.errors.DeadlineExceededError(
                f"replay shard(s) {', '.join(missing)} did not answer within "
                f"{self._timeout_s:g} s")
        total = sum_counters([self._last[k] for k in range(self.num_shards)])
        total['shards_down'] = down
        if self._settings is not None:  # the whole buffer's ratio bounds (RatioGate)
            gate = RatioGate(self._settings)
            total.update(samples_per_insert=self._settings.samples_per_insert,
                         max_diff=gate.max_diff, min_diff=gate.min_diff,
                         min_size_to_sample=self._settings.min_size_to_sample)
        return total


def sum_counters(shards):
    """The run's counters from those of its shards (all of them answering)."""
    total = {name: sum(shard[name] for shard in shards) for name in _SUMMED}
    total['samples_per_insert'] = shards[0]['samples_per_insert']
    return total


class RatioGate:
    """A sharded run's samples-per-insert ratio over the whole buffer (see the module doc).

    Reverb's `SampleToInsertRatio` rule on the summed counters: `diff = inserted x
    samples_per_insert - sampled` stays within `offset -/+ error_buffer`, where the offset
    `samples_per_insert x min_size_to_sample` lets collectors fill the minimum size before
    the learner starts.
    """

    def __init__(self, settings):
        self._spi = settings.samples_per_insert
        offset = settings.samples_per_insert * settings.min_size_to_sample
        self.min_diff = offset - settings.error_buffer
        self.max_diff = offset + settings.error_buffer

    def diff(self, inserted, sampled):
        return inserted * self._spi - sampled

    def samples_allowed(self, inserted, sampled):
        """How many more samples the shards may serve (negative: the learner waits)."""
        return self.diff(inserted, sampled) - self.min_diff

    def inserts_allowed(self, counters):
        """Whether collectors may write on: the learner is not too far behind, or a shard is
        down (`counters['shards_down']`: then the processes' readings of it differ, and only
        the learner keeps the ratio; see the module doc)."""
        if counters['shards_down']:
            return True
        return self.diff(counters['inserted'], counters['sampled']) <= self.max_diff
