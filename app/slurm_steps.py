"""Inside a distributed Slurm job: each role an srun step of it, signalled through Slurm.

`SrunStarter` is the starter that `app.slurm_distributed roles` (the supervisor the batch
script runs) hands to `experiment.distributed.cluster.run_cluster` in place of the local
launcher's: the cluster's start order, restarts and stop order stay the launcher's own, and
only how a role starts and how it is signalled changes. A role starts as `srun --ntasks=1
--cpus-per-task=K --exact --nodelist=HOST --job-name=ROLE train.py --role=...`, a named step
of this job with exactly its own cores on the node chosen for it.

Why `scancel --signal` and not a signal to srun: srun turns SIGTERM into SIGKILL of its step
("forcing job termination") and answers one SIGINT with a status line only, so a role would
never checkpoint; `scancel --signal=INT JOB.STEP` delivers SIGINT to the role itself. While
Slurm is ending the job (scancel, time limit, preemption) it signals every step itself, so
the starter then sends nothing: a role's second signal would end it unsaved.
"""

import signal
import subprocess

from app import slurm_jobs

SLURM_TIMEOUT_S = 30
# In any other job state Slurm itself is signalling (then killing) every step.
_RUNNING = 'RUNNING'


def _slurm(args, timeout_s=SLURM_TIMEOUT_S):
    """Runs a Slurm command; its CompletedProcess, or None if it could not run in time."""
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None


class SrunStarter:
    """Starts each role as an srun step of this job on its node; signals it through Slurm."""

    def __init__(self, job_id, hosts, roles, *, mem_per_cpu_mb=None, learner_gpus=0,
                 say=print):
        self.job_id = str(job_id)
        self.where = {name: (hosts[node], cores) for name, _, _, node, cores in roles}
        self.mem_per_cpu_mb = mem_per_cpu_mb
        self.learner_gpus = learner_gpus
        self.say = say
        self._ending = False

    def command(self, name, command):
        host, cores = self.where[name]
        srun = ['srun', '--ntasks=1', '--nodes=1', f'--nodelist={host}',
                f'--cpus-per-task={cores}', '--exact', f'--job-name={name}']
        if self.mem_per_cpu_mb:
            srun.append(f'--mem-per-cpu={self.mem_per_cpu_mb}M')
        if name == 'learner' and self.learner_gpus:
            srun.append(f'--gpus={self.learner_gpus}')
        self.say(f'[slurm] {name}: {slurm_jobs.quote(srun)} train.py '
                 f'{slurm_jobs.quote(command[2:])}')
        return srun + command

    def job_ending(self):
        """Whether Slurm is ending the job (scancel, time limit, preemption): it is then
        signalling every step itself, and one more signal would end a role unsaved."""
        if not self._ending:
            done = _slurm(['squeue', '-h', '-j', self.job_id, '-o', '%T'])
            state = done.stdout.strip() if done is not None and done.returncode == 0 else ''
            self._ending = bool(state) and state != _RUNNING
        return self._ending

    def steps(self, name):
        """This job's step ids (JOB.STEP) named `name`: the role's live step."""
        done = _slurm(['squeue', '-h', '-s', '-j', self.job_id, '-o', '%i %j'])
        if done is None or done.returncode != 0:
            return []
        return [fields[0] for fields in (line.split() for line in done.stdout.splitlines())
                if len(fields) == 2 and fields[1] == name]

    def send(self, name, proc, signum):
        if self.job_ending():
            return
        steps = self.steps(name)
        if not steps:  # srun is still waiting for its step's cores: nothing runs yet
            proc.kill()
            return
        for step in steps:
            done = _slurm(['scancel', f'--signal={signal.Signals(signum).name[3:]}', step])
            if done is None or done.returncode != 0:
                self.say(f'[slurm] scancel could not signal {name} (step {step}); '
                         'signalling its srun')
                proc.send_signal(signum)
