#!/usr/bin/env python3
"""stop_rank.py RANK TIMEOUT PROGRESS_FILE -- MPIRUN_COMMAND...

Starts the mpirun command, waits until PROGRESS_FILE holds two lines (the job is past its
startup), stops world rank RANK with SIGSTOP and waits for the job to end: it must end by itself,
non-zero, within TIMEOUT seconds plus a slack for the abort. Prints what happened, and mpirun's
stderr, for FileCheck; exits non-zero when the job did not end in time (then it kills it)."""
import os
import signal
import subprocess
import sys
import time

SLACK_S = 45  # mpirun's abort of every rank, on a loaded 2-core CI machine
STARTUP_S = 180


def parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def ranks_of(mpirun_pid):
    """{world rank: pid} of the ranks mpirun started on this machine (its descendants)."""
    ranks = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            if b"OMPI_COMM_WORLD_RANK" not in env:
                continue
            pid = int(entry)
            while pid > 1 and pid != mpirun_pid:
                pid = parent(pid)
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
        if pid == mpirun_pid:
            ranks[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(entry)
    return ranks


def main():
    rank, timeout, progress = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    command = sys.argv[sys.argv.index("--") + 1:]
    job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           start_new_session=True)
    stopped = None
    try:
        start = time.monotonic()
        while time.monotonic() - start < STARTUP_S and job.poll() is None:
            if os.path.exists(progress) and open(progress).read().count("\n") >= 2:
                break
            time.sleep(0.1)
        pid = ranks_of(job.pid).get(rank)
        if job.poll() is not None or pid is None:
            print(f"the job did not get going (exit {job.poll()}, rank {rank} pid {pid})")
            return 1
        os.kill(pid, signal.SIGSTOP)
        stopped = pid
        at = time.monotonic()
        try:
            _, err = job.communicate(timeout=timeout + SLACK_S)
        except subprocess.TimeoutExpired:
            print(f"the job still runs {timeout + SLACK_S:.0f} s after rank {rank} was stopped")
            return 1
        took = time.monotonic() - at
        status = "0" if job.returncode == 0 else "non-zero"
        print(f"rank {rank} stopped: the job ended by itself with exit {status} in time ({took:.1f} s)")
        sys.stdout.write(err.decode(errors="replace"))
        return 0
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGKILL)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    sys.exit(main())
