"""A two-node Slurm cluster on this machine for the tests: munged, slurmctld and two slurmd (n1, n2).

    cluster = SlurmCluster(folder).start()     # waits until sinfo shows both nodes idle
    cluster.env                                # SLURM_CONF for sbatch, squeue, scontrol, scancel
    cluster.stop()                             # ends what it started, by pid

Every daemon runs in the foreground as a child of this process, in a folder of its own (state, spool, logs,
the munge socket), on ports picked free here, so two test sessions never share one. Debian's packages
(slurmctld, slurmd, slurm-client, munge: ``scripts/system-deps`` installs them) run it as root without
systemd or cgroups: ``proctrack/linuxproc``, ``task/none`` (or ``task/affinity``, which binds without cgroups),
no accounting. The scheduler settings make a job
start within a second of ``sbatch`` and a requeued one within seconds (``cred_expire=10``).

Each node declares more CPUs and memory than the machine has (``SlurmdParameters=config_overrides`` lets slurmd
take the declaration): the tests' jobs sleep through most of their steps, so a dozen of them run at once on
two cores, and the tests submit their jobs together instead of one after another.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
NODES = ("n1", "n2")
CPUS_PER_NODE = 16  # declared, not the machine's: every test job can run at once (see above)
MEMORY_PER_NODE_MB = 16000  # DefMemPerCPU=1000 for each of them
READY_WITHIN_S = 30.0


def unavailable_reason() -> str | None:
    """Why no test cluster can start here, in one line; None where it can."""
    missing = [name for name in (*DAEMONS, "sbatch", "squeue", "sinfo") if shutil.which(name) is None
               and not Path("/usr/sbin", name).exists()]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing): scripts/system-deps installs slurmctld, "
                "slurmd, slurm-client and munge")
    if os.geteuid() != 0:
        return "the test Slurm cluster runs its daemons as root (SlurmUser=root): run the Slurm tests as root"
    if not Path("/etc/munge/munge.key").is_file():
        return "munge has no key (/etc/munge/munge.key): reinstall the munge package"
    return None


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _daemon(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    """munged + slurmctld + slurmd n1, n2 in ``folder``; ``env`` points Slurm's commands at it."""

    def __init__(self, folder: Path, *, cpus_per_node: int = CPUS_PER_NODE, binds_cores: bool = False):
        """``binds_cores``: each task is bound to the cores Slurm gave it (``task/affinity``, ``TaskPluginParam=
        Cores``), which needs ``cpus_per_node`` to be at most this machine's cores."""
        self.folder = Path(folder)
        self.cpus_per_node = cpus_per_node
        self.task_plugin = "task/affinity\nTaskPluginParam=Cores" if binds_cores else "task/none"
        self.conf = self.folder / "slurm.conf"
        self.processes: list[subprocess.Popen] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        # Each test cluster numbers its jobs from its own start: a job's rendezvous port follows its id
        # (control/slurm_job.py), and two xdist workers' clusters may run jobs on this machine at once.
        self.first_job_id = 1000 + 100 * random.randrange(180)

    def _write_conf(self) -> None:
        host = socket.gethostname().split(".")[0]
        ctld_port, *node_ports = _free_ports(1 + len(NODES))
        state, spool = self.folder / "state", self.folder / "spool"
        for sub in (state, spool, self.folder / "log"):
            sub.mkdir(parents=True, exist_ok=True)
        nodes = "\n".join(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs={self.cpus_per_node} "
                          f"RealMemory={MEMORY_PER_NODE_MB} State=UNKNOWN" for n, p in zip(NODES, node_ports))
        self.conf.write_text(f"""ClusterName=parallaxtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.folder / 'munge.socket'},cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin={self.task_plugin}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=2
SlurmdParameters=config_overrides
MinJobAge=60
FirstJobId={self.first_job_id}
ReturnToService=2
StateSaveLocation={state}
SlurmdSpoolDir={spool}/%n
SlurmctldPidFile={self.folder}/slurmctld.pid
SlurmdPidFile={self.folder}/slurmd-%n.pid
SlurmctldLogFile={self.folder}/log/slurmctld.log
SlurmdLogFile={self.folder}/log/slurmd-%n.log
MpiDefault=none
{nodes}
PartitionName=test Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
""")

    def _start(self, argv: list[str], log: str) -> None:
        out = open(self.folder / "log" / log, "ab")
        with out:
            self.processes.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                                   env=self.env, start_new_session=True))

    def start(self) -> SlurmCluster:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._write_conf()
        try:
            self._start([_daemon("munged"), "-F", "--force", f"--socket={self.folder / 'munge.socket'}",
                         f"--pid-file={self.folder / 'munged.pid'}", f"--log-file={self.folder / 'log/munged.log'}",
                         f"--seed-file={self.folder / 'munged.seed'}"], "munged.out")
            self._wait(lambda: (self.folder / "munge.socket").exists(), "munged's socket")
            self._start([_daemon("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld.out")
            for node in NODES:
                self._start([_daemon("slurmd"), "-D", "-f", str(self.conf), "-N", node], f"slurmd-{node}.out")
            self._wait(self._nodes_idle, "both nodes idle in sinfo")
        except BaseException:
            self.stop()
            raise
        return self

    def _nodes_idle(self) -> bool:
        result = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True,
                                timeout=10)
        states = dict(line.split() for line in result.stdout.splitlines() if line.strip())
        return all(states.get(node) == "idle" for node in NODES)

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + READY_WITHIN_S
        while time.monotonic() < deadline:
            dead = [p.args[0] for p in self.processes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while starting the test Slurm cluster; see "
                                   f"{self.folder / 'log'}")
            try:
                if ready():
                    return
            except (subprocess.SubprocessError, OSError, ValueError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"no {what} within {READY_WITHIN_S:g} s; see {self.folder / 'log'}")

    def squeue_ids(self) -> list[str]:
        result = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True, timeout=10)
        return result.stdout.split()

    def cancel_all(self) -> None:
        """End every job still queued or running (between tests)."""
        ids = self.squeue_ids()
        if ids:
            subprocess.run(["scancel", *ids], env=self.env, capture_output=True, timeout=10)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(
                state not in ("CANCELLED", "COMPLETED", "FAILED", "TIMEOUT") for state in self._job_states()):
            time.sleep(0.5)

    def _job_states(self) -> list[str]:
        result = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%T"], env=self.env, capture_output=True,
                                text=True, timeout=10)
        return result.stdout.split()

    def stop(self) -> None:
        """SIGTERM to each daemon (slurmd first), SIGKILL to any still there after 10 s."""
        with_jobs_first = list(reversed(self.processes))
        for process in with_jobs_first:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in with_jobs_first:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        self.processes.clear()
        for pid in self.leftovers():  # steps of a job that outlived its cancel (slurmstepd, its tasks)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def leftovers(self) -> list[int]:
        """Processes that run with this cluster's SLURM_CONF in their environment: its jobs' steps and tasks."""
        mark = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    if mark in (entry / "environ").read_bytes().split(b"\0"):
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found
