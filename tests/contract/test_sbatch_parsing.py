"""Extra #SBATCH lines read as sbatch reads them: a line that sets an option Parallax sets (in any spelling sbatch
takes: a prefix, a short letter, combined letters, a value in the next word, an option inside another's value,
a quoted option) is refused naming the option; the table agrees with the installed sbatch, and on the test
cluster sbatch really does set what the parser says such a line sets.

    .venv/bin/python -m pytest tests/contract/test_sbatch_parsing.py -q
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from contract.config import ConfigError, RunConfig
from contract.sbatch_parsing import LONG_OPTIONS, read_sbatch_lines, sbatch_word
from contract.slurm_options import SET_BY_PARALLAX
from trainer_backend.control.slurm_job import sbatch_options

ON_SLURM = {"where": "slurm", "strategy": "ddp"}


def refusal(lines: list[str]) -> str:
    with pytest.raises(ConfigError) as refused:
        RunConfig(**ON_SLURM, slurm_extra=lines)
    assert refused.value.field == "slurm_extra" and "\n" not in str(refused.value)
    return str(refused.value)


@pytest.mark.parametrize("line, option", [
    ("--out=/tmp/x", "output"), ("--outp=/tmp/x", "output"), ("--err=/tmp/e", "error"), ("--sig=B:USR1@5", "signal"),
    ("--req", "requeue"), ("--no-req", "no-requeue"), ("--job=stolen", "job-name"), ("--arr=0-3", "array"),
    ("--open=truncate", "open-mode"), ("--part=gpu", "partition"), ("--acco=x", "account"), ("--wra=ls", "wrap"),
    ("--tasks-per-node=4", "ntasks-per-node"), ("--ntasks 4", "ntasks"), ("--cpus-per-t=4", "cpus-per-task"),
    ("--export=NONE", "export"), ("--get-user-env", "get-user-env"), ("--cluster=other", "clusters"),
    ("--test", "test-only"), ("--uid=0", "uid"),
    # short letters, alone, with the value in the word or the next word, and combined
    ("-o /tmp/x", "output"), ("-o/tmp/x", "output"), ("-e /tmp/e", "error"), ("-J stolen", "job-name"),
    ("-a 0-3", "array"), ("-p gpu", "partition"), ("-t 5", "time"), ("-N 3", "nodes"), ("-n 4", "ntasks"),
    ("-c 8", "cpus-per-task"), ("-A acct", "account"), ("-q high", "qos"), ("-D /tmp", "chdir"), ("-W", "wait"),
    ("-V", "version"), ("-h", "help"), ("-M other", "clusters"), ("-Ho/tmp/x", "output"), ("-vQJ stolen", "job-name"),
    ("-output=/tmp/x", "output"),  # getopt_long reads it as -o utput=/tmp/x
    # inside another option's value, or quoted so that it does not look like one
    ("--constraint=a100 --output=/tmp/x", "output"), ("--comment=a -o /tmp/x", "output"),
    ("-C a100 -J stolen", "job-name"), ('"--output=/tmp/x"', "output"), ("'-o' /tmp/x", "output"),
    (r"--out\put=/tmp/x", "output"), ("--comment=a\t-o x".replace("\t", " "), "output"),
])
def test_a_line_that_sets_what_parallax_sets_is_refused_naming_the_option(line, option):
    text = refusal([line])
    assert f"it sets --{option}" in text and repr(line)[:40] in text, text


def test_an_option_spread_over_two_lines_is_refused_not_read_from_the_next_one():
    text = refusal(["--comment", "-o /tmp/x"])
    assert "--comment takes a value: give it on the same line" in text


@pytest.mark.parametrize("line, words", [
    ("--o=/tmp/x", "sbatch reads --o as any of --open-mode, --output, --overcommit, --oversubscribe"),
    ("--constraint=a b", "'b' is not an sbatch option"),
    ("--comment=\"unclosed", "is never closed"),
    ("--comment \"\" -o /tmp/x", "an empty value"),
    ("--comment=a hetjob -o /tmp/x", "heterogeneous job"),
    ("-- --output=/tmp/x", "sbatch reads no option after '--'"),
    ("-I", "-I (in '-I') is not an sbatch option"),
    ("--hold=yes", "--hold takes no value"), ("--hol=yes", "--hol (--hold) takes no value"),
    ("exclusive", "'exclusive' is not an sbatch option: sbatch stops reading options there"),
    ("--comment=a\nb", "one line of printable text"),
])
def test_a_line_sbatch_would_refuse_or_read_otherwise_is_refused_in_one_line(line, words):
    assert words in refusal([line])


@pytest.mark.parametrize("lines", [
    ["--constraint=a100", "--exclusive"], ["-C a100", "--hold -Q"], ['--comment="a -o /tmp/x"'],
    ["--comment=x # -o /tmp/y"], ["--mail-type=END --mail-user=me@lab.example"], ["--gres=gpu:a100:1"],
    ["--time-min=5", "--mem-per-cpu=2G"], ["--nodelist=n1,n2 --exclude=n3"], ["--some-newer-option=1"],
    ["-k"], ["--dependency=afterok:12"],
])
def test_lines_that_leave_parallax_s_options_alone_are_kept(lines):
    assert RunConfig(**ON_SLURM, slurm_extra=lines).slurm_extra == tuple(lines)


def test_every_option_parallax_renders_is_one_no_line_may_set():
    config = RunConfig(**ON_SLURM, devices="cuda", slurm_gpus_per_node=2, slurm_partition="gpu", slurm_time="1:00",
                       slurm_mem="8G", slurm_account="lab", slurm_qos="high")
    rendered = sbatch_options(config, job_name="parallax-1", output=Path("/home/a b/#1/run.log"))
    read = read_sbatch_lines(rendered)
    assert len(read) == len(rendered)  # each line one option: the path with a blank and a # stays one word
    assert {option.sets for option in read} | {"parsable", "array"} <= set(SET_BY_PARALLAX)


@pytest.mark.parametrize("value", ["/plain/path.log", "/my runs #2/x.log", "a\"b\\c'd", " lead", "tab\there"])
def test_a_value_written_for_sbatch_reads_back_as_one_word(value):
    assert read_sbatch_lines([f"--output={sbatch_word(value)}"])[0].sets == "output"
    from contract.sbatch_parsing import _words

    assert _words(f"--comment={sbatch_word(value)}", 0) == [f"--comment={value}"]


@pytest.mark.processes
def test_the_option_table_is_the_installed_sbatch_s(tmp_path):
    """glibc's getopt names every option a one-letter prefix could be: the installed sbatch's answers, letter by
    letter, are the table's."""
    from tests.slurm_cluster import unavailable_reason

    if (reason := unavailable_reason()) is not None and "not installed" in reason:
        pytest.skip(reason)
    conf = tmp_path / "slurm.conf"  # enough for sbatch to read its options; no controller answers
    conf.write_text("ClusterName=parse\nSlurmctldHost=localhost(127.0.0.1)\nNodeName=n1 CPUs=1\n"
                    "PartitionName=p Nodes=n1 Default=YES\n")
    for letter in "abcdefghijklmnopqrstuvwxyz":
        said = subprocess.run(["sbatch", f"--{letter}=1", "--wrap=true"], env={"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True, timeout=30).stderr
        ours = [option.name for option in LONG_OPTIONS if option.name.startswith(letter)]
        if "is ambiguous" in said:
            assert sorted(re.findall(r"'--([a-z-]+)'", said.split("possibilities:")[1])) == sorted(ours), said
        elif "unrecognized option" in said:
            assert ours == [], said
        else:
            assert len(ours) == 1, said


def scontrol_fields(cluster, job_id: str) -> dict[str, str]:
    shown = subprocess.run(["scontrol", "show", "job", job_id], env=cluster.env, capture_output=True, text=True,
                           timeout=10).stdout
    return dict(re.findall(r"(\w+)=(\S*)", shown))


@pytest.mark.processes
def test_the_real_sbatch_sets_what_the_parser_says_a_line_sets(slurm_cluster, tmp_path):
    """Each hostile line, put after Parallax's own lines in a held job, really overrides the option the
    parser names (so refusing it matters); a value that only looks like an option does not."""
    config = RunConfig(**ON_SLURM)
    own = sbatch_options(config, job_name="parallax-7", output=tmp_path / "run.log")
    cases = {"--out=/tmp/stolen.log": ("output", "StdOut", "/tmp/stolen.log"),
             "-Ho/tmp/stolen.log": ("output", "StdOut", "/tmp/stolen.log"),
             "--comment=a -J stolen": ("job-name", "JobName", "stolen"),
             '"--job-name=quoted"': ("job-name", "JobName", "quoted"),
             "--comment=b -e /tmp/stolen.err": ("error", "StdErr", "/tmp/stolen.err"),
             "--no-req": ("no-requeue", "Requeue", "0"),
             '--comment="c -o /tmp/stolen.log"': (None, "StdOut", str(tmp_path / "run.log"))}
    try:
        for number, (line, (option, field, expected)) in enumerate(cases.items()):
            assert {o.sets for o in read_sbatch_lines([line])} & set(SET_BY_PARALLAX) == ({option} if option else set())
            script = tmp_path / f"job{number}.sh"
            script.write_text("#!/bin/bash\n" + "".join(f"#SBATCH {each}\n" for each in [*own, line]) + "true\n")
            submitted = subprocess.run(["sbatch", "--parsable", "--hold", str(script)], env=slurm_cluster.env,
                                       capture_output=True, text=True, timeout=30, cwd=tmp_path)
            assert submitted.returncode == 0, submitted.stderr
            assert scontrol_fields(slurm_cluster, submitted.stdout.strip().split(";")[0])[field] == expected, line
    finally:
        slurm_cluster.cancel_all()
