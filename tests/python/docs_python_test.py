"""docs/python.md's examples, run as a user runs them (the ctest entry python_docs_test).

The same rules as tests/docs/docs_test.cc, which runs README.md and the other docs: every fenced
block whose info string says `test` runs, in order, in a fresh directory with the built `ablate`
and `ablate-worker` first on PATH and no ABLATE_* variables; the shipped `experiments/` and
`proto/` are linked in (a user's study directory beside an ablate checkout).

  ```sh test          one bash script (-e) that must exit 0; a line ending in `&` starts
                      something in the background, and the block then waits for its first
                      line of output.
  ```console test     `$ COMMAND` lines, each followed by what it prints (stdout and stderr);
                      a line `...` stands for any number of lines; numbers, run keys, commit
                      hashes and runs of spaces may differ. `# exits N` after a command: it
                      must fail with code N (else exit 0).
  ```LANG test FILE   the block is written to FILE for the blocks after it: the script shown is
                      the script that runs.

Whatever the document started is stopped afterwards (SIGTERM, then SIGKILL): every process it
started carries ABLATE_DOCS_TEST=<tag> in its environment.

Runs with Debian's /usr/bin/python3, the interpreter the document uses: python3-pandas,
python3-grpcio and python3-protobuf (`make deps-test`) are installed for it.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time


class Block:
    def __init__(self, kind, line, file=""):
        self.kind = kind  # "sh", "console" or "file"
        self.line = line
        self.file = file
        self.script = ""
        self.commands = []  # console: [line, text, expected lines, exit code]


def test_blocks(doc):
    blocks, block, fenced = [], None, False
    with open(doc) as f:
        for number, line in enumerate(f.read().splitlines(), start=1):
            if line.startswith("```"):
                if fenced:
                    fenced, block = False, None
                    continue
                fenced = True
                words = line[3:].split()
                if "test" not in words[1:]:
                    continue
                after = words[words.index("test") + 1:]
                kind = words[0] if words[0] in ("sh", "console") else "file"
                block = Block(kind, number, after[0] if after else "")
                blocks.append(block)
                continue
            if block is None:
                continue
            if block.kind != "console":
                block.script += line + "\n"
                continue
            last = block.commands[-1] if block.commands else None
            if last is not None and not last[2] and last[1].endswith("\\"):
                last[1] += "\n" + line
            elif line.startswith("$ "):
                block.commands.append([number, line[2:], [], 0])
            elif last is not None:
                last[2].append(line)
    for b in blocks:
        for c in b.commands:
            m = re.search(r"#\s*exits\s+(\d+)\s*$", c[1])
            if m:
                c[3] = int(m.group(1))
    return blocks


def normalize(line):
    """What may differ between the doc and a run: numbers, run keys, commit hashes, alignment."""
    line = re.sub(r"(^|[^.\w])[0-9a-f]{16}(?!\w)", r"\1#", line)
    line = re.sub(r"\+[0-9a-f]{7,12}\b", "+#", line)
    line = re.sub(r"[0-9][0-9,]*(\.[0-9]+)?([eE][-+]?[0-9]+)?", "0", line)
    return re.sub(r"\s+", " ", line).strip()


def lines(text):
    return [l for l in text.splitlines() if normalize(l)]


def matches(expected, i, actual, j):
    if i == len(expected):
        return j == len(actual)
    if normalize(expected[i]) == "...":
        return any(matches(expected, i + 1, actual, k) for k in range(j, len(actual) + 1))
    return (j < len(actual) and normalize(expected[i]) == normalize(actual[j])
            and matches(expected, i + 1, actual, j + 1))


def processes_with(tag):
    """Pids of the processes whose environment holds `tag` (this test's, and only those)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if tag.encode() in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass  # gone, or not ours to read
    return found


class Runner:
    def __init__(self, doc, source, bin_dir, keep):
        self.doc = doc
        self.tag = "ABLATE_DOCS_TEST=python_md_%d" % os.getpid()
        self.dir = tempfile.mkdtemp(prefix="ablate_docs_python_")
        self.keep = keep
        for name in ("experiments", "proto"):
            os.symlink(os.path.join(source, name), os.path.join(self.dir, name))
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("ABLATE_") and k != "PATH"}
        self.env["PATH"] = bin_dir + ":" + os.environ.get("PATH", "/usr/bin:/bin")
        self.env["ABLATE_DOCS_TEST"] = self.tag.split("=", 1)[1]
        self.failures = 0
        self.passed = 0

    def bash(self, script, errexit, log):
        args = ["bash"] + (["-e"] if errexit else []) + ["-c", script]
        with open(log, "w") as out:
            return subprocess.Popen(args, cwd=self.dir, env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT)

    def fail(self, where, message):
        self.failures += 1
        print(f"FAIL {where}: {message}", flush=True)

    def run_sh(self, block, where):
        log = os.path.join(self.dir, f"block-{block.line}.log")
        code = self.bash(block.script, True, log).wait(timeout=600)
        output = open(log).read()
        if code != 0:
            self.fail(where, f"the block exited {code}:\n{block.script}--- output:\n{output}")
            return False
        if "&\n" in block.script:
            deadline = time.time() + 60
            while not open(log).read() and time.time() < deadline:
                time.sleep(0.1)
            if not open(log).read():
                self.fail(where, "what the block started printed nothing in 60 s")
                return False
        self.passed += 1
        print(f"ok   {where}: sh", flush=True)
        return True

    def run_console(self, block):
        for line, text, expected, exit_code in block.commands:
            where = f"{self.doc}:{line}"
            log = os.path.join(self.dir, f"command-{line}.log")
            code = self.bash(text, False, log).wait(timeout=600)
            output = open(log).read()
            if code != exit_code:
                self.fail(where, f"$ {text}\nexited {code}, the doc says {exit_code}:\n{output}")
                return False
            if not matches(lines("\n".join(expected)), 0, lines(output), 0):
                self.fail(where, f"$ {text}\n--- the doc shows:\n" + "\n".join(expected) +
                          f"\n--- it printed:\n{output}")
                return False
            self.passed += 1
            print(f"ok   {where}: $ {text}", flush=True)
        return True

    def run(self):
        blocks = test_blocks(self.doc)
        if not blocks:
            self.fail(self.doc, "no `sh test` or `console test` block")
        try:
            for block in blocks:
                where = f"{self.doc}:{block.line}"
                if block.kind == "sh":
                    ok = self.run_sh(block, where)
                elif block.kind == "console":
                    ok = self.run_console(block)
                elif not block.file:
                    self.fail(where, "a `LANG test` block names its file")
                    ok = False
                else:
                    with open(os.path.join(self.dir, block.file), "w") as f:
                        f.write(block.script)
                    ok = True
                if not ok:
                    break  # later blocks build on this one
        finally:
            self.stop()
        if self.failures == 0 and not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            print(f"the document's directory: {self.dir}")

    def stop(self):
        for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
            for pid in processes_with(self.tag):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + wait
            while processes_with(self.tag) and time.time() < deadline:
                time.sleep(0.2)
            if not processes_with(self.tag):
                return


def self_test():
    """The matching rules themselves, as docs_test.cc's DocsHarnessTest has them."""
    assert normalize("0  baseline   0  -   279,232  891cd08d774519d1") == \
        normalize("0 baseline 0 - 279,488 50b3bba759aeeb1f")
    assert normalize("code 0.1.0+ffe61f5") == normalize("code 0.1.0+3dc3d03")
    assert normalize("4 runs, 4 queued") != normalize("4 runs, 4 reused")
    assert matches(["first", "...", "last 1"], 0, ["first", "a", "b", "last 2"], 0)
    assert matches(["first", "...", "last 1"], 0, ["first", "last 2"], 0)
    assert not matches(["first", "...", "last 1"], 0, ["first", "a"], 0)
    assert not matches(["first"], 0, ["first", "extra"], 0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--doc", required=True, help="the document (docs/python.md)")
    p.add_argument("--source", required=True, help="the source tree: experiments/, proto/")
    p.add_argument("--bin-dir", required=True, help="where the built ablate binaries are")
    p.add_argument("--keep", action="store_true", help="keep the document's directory")
    a = p.parse_args()
    self_test()
    missing = []
    for module, package in (("pandas", "python3-pandas"), ("grpc", "python3-grpcio"),
                            ("google.protobuf", "python3-protobuf")):
        try:
            __import__(module)
        except ImportError:
            missing.append(package)
    if missing:
        print(f"FAIL: {sys.executable} lacks {', '.join(missing)}: apt-get install them "
              "(make deps-test)")
        print("0 passed, 1 failed")
        return 1
    runner = Runner(a.doc, a.source, a.bin_dir, a.keep)
    runner.run()
    print(f"{runner.passed} passed, {runner.failures} failed")
    return 0 if runner.failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
