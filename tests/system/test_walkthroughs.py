"""
The manual's walkthroughs, followed as a new operator would type them.

The ``.. code-block:: console`` blocks of a docs/guide page marked
``:class: walkthrough`` are run command by command (``$ `` starts one; ``> `` and a
trailing backslash continue it), in order, in one bash in an empty
directory, with this checkout's Python first on PATH (the installed
virtual environment, active).  Only what must differ on a test machine is
changed: the pages' ports 1883, 1884 and 9883 become free ones.  What a
page shows under a command must be printed by it, line by line in order
(``...`` stands for anything, other lines may come between); a command
with nothing shown under it must succeed.  Where an operator would wait
for a program started with ``&`` to come up, the test waits until the
ports its command names accept connections.  Each command has a deadline,
and whatever the page left running is stopped afterwards.
"""

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import require_program
from tests.mosquitto_broker import free_port

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide"
PORTS = (1883, 1884, 9883)
OUTSIDE = ("mosquitto", "mosquitto_pub", "mosquitto_sub", "curl")
# The pipeline starts a JVM and runs Spark: minutes on a loaded machine.
DEADLINE, SPARK_DEADLINE, START_DEADLINE = 60, 900, 30


@dataclass
class Step:
    command: str
    expected: list = field(default_factory=list)


def read_walkthroughs(text):
    """The walkthrough blocks of an rst source, each a list of Steps."""
    lines, blocks, i = text.splitlines(), [], 0
    while i < len(lines):
        if lines[i].strip() != ".. code-block:: console":
            i += 1
            continue
        i += 1
        options = []
        while i < len(lines) and lines[i].strip().startswith(":"):
            options.append(lines[i].strip())
            i += 1
        body = []
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
            body.append(lines[i])
            i += 1
        if ":class: walkthrough" in options:
            blocks.append(_steps(body))
    return blocks


def _steps(body):
    indent = min(len(line) - len(line.lstrip()) for line in body if line.strip())
    steps = []
    for line in (line[indent:] for line in body):
        if line.startswith("$ "):
            steps.append(Step(line[2:]))
        elif steps and (line.startswith("> ") or line == ">"):
            steps[-1].command += "\n" + line[2:]
        elif steps and steps[-1].command.endswith("\\") and not steps[-1].expected:
            steps[-1].command += "\n" + line
        elif line.strip():
            assert steps, f"output before any command: {line!r}"
            steps[-1].expected.append(line)
    return steps


def shown_output_missing(expected, output):
    """The first line of ``expected`` not printed, in order, in ``output``; None when all were."""
    lines = iter(output.splitlines())
    for want in expected:
        pattern = re.compile(".*".join(re.escape(part) for part in want.strip().split("...")))
        if not any(pattern.fullmatch(line.strip()) for line in lines):
            return want
    return None


class Shell:
    """One bash fed a command at a time, its output (and its jobs') collected."""

    def __init__(self, cwd, env):
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True,
        )
        self.output, self.count = b"", 0
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for chunk in iter(lambda: os.read(self.process.stdout.fileno(), 65536), b""):
            with self.changed:
                self.output += chunk
                self.changed.notify_all()

    def run(self, command, deadline):
        """The command's output and exit status; fails past ``deadline`` seconds."""
        self.count += 1
        marker = f"@@step-{self.count}@@"
        start = len(self.output)
        # eval runs it in this shell (variables and jobs stay); stdin is
        # not the commands that follow.
        self.process.stdin.write(f"eval {shlex.quote(command)} </dev/null\nprintf '\\n%s %d\\n' {marker} $?\n".encode())
        self.process.stdin.flush()
        found = re.compile(rf"\n{re.escape(marker)} (\d+)\n".encode())
        end = time.monotonic() + deadline
        with self.changed:
            while not (match := found.search(self.output, start)):
                left = end - time.monotonic()
                assert left > 0, f"no end within {deadline}s of: {command}\n{self.output[start:].decode()}"
                self.changed.wait(min(left, 1))
        return self.output[start:match.start()].decode(errors="replace"), int(match.group(1))

    def close(self):
        try:
            self.process.stdin.write(b"kill $(jobs -p) 2>/dev/null; wait; exit\n")
            self.process.stdin.close()
            self.process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=10)


def wait_for_ports(ports, shell):
    end = time.monotonic() + START_DEADLINE
    for port in ports:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < end, f"nothing on port {port}:\n{shell.output.decode()}"
                with shell.changed:
                    shell.changed.wait(0.1)


def follow(steps, workdir):
    """Run ``steps`` literally in ``workdir``; a list of what went wrong."""
    for _ in range(10):  # the kernel may hand out one port twice
        ports = {port: free_port() for port in PORTS}
        if len(set(ports.values())) == len(PORTS):
            break
    else:
        pytest.fail("no distinct free ports")
    rewrite = re.compile(r"(?<!\d)(%s)(?!\d)" % "|".join(map(str, PORTS)))

    def local(text):
        return rewrite.sub(lambda m: str(ports[int(m.group(1))]), text)

    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
               PYTHONPATH=str(ROOT))
    shell, problems = Shell(workdir, env), []
    try:
        for step in steps:
            command = local(step.command)
            deadline = SPARK_DEADLINE if "mqttgw.pipeline" in command else DEADLINE
            output, status = shell.run(command, deadline)
            expected = [local(line) for line in step.expected]
            if expected and (missing := shown_output_missing(expected, output)) is not None:
                problems.append(f"$ {command}\ndid not print {missing!r}; it printed:\n{output}")
            elif not expected and status != 0:
                problems.append(f"$ {command}\nexited {status}:\n{output}")
            if problems:
                break
            if command.rstrip().endswith("&"):
                wait_for_ports([p for p in ports.values() if re.search(rf"(?<!\d){p}(?!\d)", command)], shell)
    finally:
        shell.close()
    return problems


def _walkthroughs():
    """A page's walkthrough blocks, one after another in one shell."""
    found = []
    for page in sorted(GUIDE.glob("*.rst")):
        if blocks := read_walkthroughs(page.read_text()):
            found.append(pytest.param([step for block in blocks for step in block], id=page.stem))
    return found


WALKTHROUGHS = _walkthroughs()


def test_the_operators_tasks_each_have_a_walkthrough():
    pages = {param.id for param in WALKTHROUGHS}
    assert {"securing", "bridges", "getting-started", "pipeline"} <= pages
    for param in WALKTHROUGHS:
        (steps,) = param.values
        assert any(step.expected for step in steps), param.id


@pytest.mark.parametrize("steps", WALKTHROUGHS)
def test_a_walkthrough_does_what_its_page_says(steps, tmp_path):
    commands = " ".join(step.command for step in steps)
    for program in OUTSIDE:
        if re.search(rf"(^|[\s|;(]){program}\s", commands, re.M):
            require_program(program)
    if "mqttgw.pipeline" in commands:
        require_program("java")
    assert follow(steps, tmp_path) == []


def test_the_reader_takes_commands_continuations_and_shown_output():
    (steps,) = read_walkthroughs(
        ".. code-block:: console\n   :class: walkthrough\n\n"
        "   $ cat > f <<'EOF'\n   > a line\n   > EOF\n   $ echo one \\\n       two\n   one two\n\nAfter.\n"
        ".. code-block:: console\n\n   $ not a walkthrough\n"
    )
    assert [s.command for s in steps] == ["cat > f <<'EOF'\na line\nEOF", "echo one \\\n    two"]
    assert steps[1].expected == ["one two"]


def test_a_walkthrough_whose_output_differs_from_its_page_fails(tmp_path):
    assert follow([Step("echo 1883"), Step("echo 9883", ["9883"])], tmp_path) == []
    (problem,) = follow([Step("echo hello"), Step("echo world", ["the world ..."]), Step("touch never")], tmp_path)
    assert "did not print 'the world ...'" in problem
    assert not (tmp_path / "never").exists()
    (problem,) = follow([Step("false")], tmp_path)
    assert "exited 1" in problem


def test_what_a_page_left_running_is_stopped(tmp_path):
    shell = Shell(tmp_path, dict(os.environ))
    output, _ = shell.run("sleep 300 & echo $!", DEADLINE)
    pid = int(output.split()[0])
    shell.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _configuration_examples():
    """The guides' literal blocks that are TOML files (their first table header first)."""
    for page in sorted(GUIDE.glob("*.rst")):
        for block in re.findall(r"::\n\n((?:   .*\n|\n)+)", page.read_text()):
            text = textwrap.dedent(block)
            lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
            if lines and re.fullmatch(r"\[\[?[a-z_]+\]\]?", lines[0]):
                yield pytest.param(text, id=f"{page.stem}-{lines[0].strip('[]')}")


@pytest.mark.parametrize("text", list(_configuration_examples()))
def test_the_guides_configuration_examples_are_accepted_as_they_are(text, tmp_path):
    # Copied whole into a file, each starts a gateway's configuration.
    from mqttgw.service import config

    path = tmp_path / "mqttgw.toml"
    path.write_text(text)
    config.build(config.load_file(str(path)), {})
