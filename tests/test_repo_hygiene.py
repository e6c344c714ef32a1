"""What the repository holds: no large run leftovers tracked, every file README.md and docs/
cite (relative links, backticked repository paths) present (a dated result in docs/results/
may cite a file since removed that git history holds), no citation of a design document the
repository does not have."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LARGE = 1 << 20  # a tracked file outside docs/ above this is a run's output, not source
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()


def tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout (git ls-files failed: {e})")
    names = [n for n in out.stdout.decode().split("\0") if n]
    if not names:
        pytest.skip("git ls-files lists nothing: not a git checkout of this repository")
    return names


def cited_docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


MD_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")  # DIR, OUT, P: a name the reader fills in


def relative_links(text: str) -> list[str]:
    out = []
    for target in MD_LINK.findall(FENCE.sub("", text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        out.append(target.split("#", 1)[0])
    return out


def repo_path(token: str, tops: set[str]) -> str | None:
    """The repository path a backticked token names, or None where it names none (a command's
    word, a glob, a placeholder)."""
    token = token.lstrip("'\"([").rstrip("'\")],;.")  # quoting and the sentence's punctuation
    token = re.split(r"::|:(?=[A-Za-z_])|\[", token, maxsplit=1)[0]  # file:func, file::test, row[id]
    token = token.rstrip(":.,")
    if token == "README.md":
        return token
    head, sep, _ = token.partition("/")
    if not sep or head not in tops:
        return None
    if any(c in token for c in "*?<>{}$|=") or "..." in token:
        return None
    if any(PLACEHOLDER.match(part) and part not in tops for part in token.split("/")[1:]):
        return None
    return token.rstrip("/")


def cited_paths(text: str, tops: set[str]) -> list[str]:
    words = []
    for block in FENCE.findall(text):
        words += block.split()
    for span in SPAN.findall(FENCE.sub("", text)):
        words += span.split()
    return [p for p in (repo_path(w, tops) for w in words) if p]


def test_no_large_file_tracked_outside_docs():
    big = []
    for name in tracked():
        p = ROOT / name
        if name.startswith("docs/") or not p.is_file():
            continue
        if p.stat().st_size > LARGE:
            big.append(f"{name} ({p.stat().st_size:,} bytes)")
    assert not big, f"tracked files larger than {LARGE:,} bytes outside docs/: {big}"


def top_folders() -> set[str]:
    """The repository's top-level folders: git's where this is a checkout (a stray folder of run
    output is not one), else what is on disk."""
    try:
        names = tracked()
    except pytest.skip.Exception:
        return {p.name for p in ROOT.iterdir() if p.is_dir() and p.name != ".git"}
    return {n.split("/", 1)[0] for n in names if "/" in n}


RESULTS = ROOT / "docs" / "results"


def in_history(path: str) -> bool:
    """Whether a commit before this checkout's HEAD held ``path``: a dated result is history and
    keeps citing what its run used after the file is removed."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%h", "HEAD", "--", path], cwd=ROOT,
                             capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"a dated result cites {path}, removed, and git cannot say whether history has it: {e}")
    return bool(out.stdout.strip())


def test_every_cited_file_exists():
    tops = top_folders()
    missing = []
    for doc in cited_docs():
        text = doc.read_text()
        here = doc.parent.relative_to(ROOT)
        for target in relative_links(text):
            resolved = (ROOT / here / target).resolve()
            if not resolved.is_relative_to(ROOT):
                missing.append(f"{doc.relative_to(ROOT)}: link {target} leaves the repository")
            elif not resolved.exists():
                missing.append(f"{doc.relative_to(ROOT)}: link {target}")
        for path in cited_paths(text, tops):
            if not (ROOT / path).exists() and not (doc.is_relative_to(RESULTS) and in_history(path)):
                missing.append(f"{doc.relative_to(ROOT)}: `{path}`")
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)


def test_the_path_rules_see_what_they_should():
    tops = {"docs", "bench", "verify", "fast", ".ci"}
    text = ("see `docs/a.md`, `verify/gate.py:GPU_WORKERS`, `pytest bench/x.py -k y`, `.ci/run`, "
            "`fast/k/*.cu`, `bench/gpu_gate.sh verify|bench`, `docs/.../x.md`, `docs/DIR/a`, "
            "`pkg/not_a_top.py`, `README.md`, and [a link](docs/b.md#part) [web](https://x.y/z)\n"
            "```\npython3 verify/c.py --out OUT\n```\n")
    assert cited_paths(text, tops) == ["verify/c.py", "docs/a.md", "verify/gate.py", "bench/x.py",
                                       ".ci/run", "bench/gpu_gate.sh", "README.md"]
    assert relative_links(text) == ["docs/b.md"]


def test_history_holds_tracked_files_only():
    """The dated results' exception has teeth: a path no commit held is not in history."""
    tracked()  # skips where this is not a git checkout
    assert in_history("tests/test_repo_hygiene.py")
    assert not in_history("docs/results/no-such-result.md")


def test_no_tracked_file_cites_a_design_document_the_repository_lacks():
    assert not (ROOT / "DESIGN.md").exists(), "DESIGN.md exists now: this check is moot"
    cites = []
    for name in tracked():
        p = ROOT / name
        if name == THIS or not p.is_file():
            continue
        for i, line in enumerate(p.read_bytes().split(b"\n"), 1):
            if b"DESIGN.md" in line:
                cites.append(f"{name}:{i}")
    assert not cites, f"DESIGN.md is cited but the repository has none: {cites}"


def test_the_readme_is_short_and_counts_no_tests():
    """The README is a newcomer's two minutes (the reference material is docs/user-guide.md), and
    says no count of tests a later commit makes stale: the run's summary line says those."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 100, "README.md grew past 100 lines: move the detail to docs/user-guide.md"
    stale = re.findall(r"\b\d[\d,]*\s+(?:GPU\s+)?(?:tests?|passed|skipped|failed)\b", text)
    assert not stale, f"README.md counts tests: {stale}"
    assert "docs/user-guide.md" in text


def _defined_twice(tree) -> list[str]:
    """Names a class body binds with two function definitions (the later hides the earlier),
    property setters and typing overloads aside."""
    import ast

    out = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        seen = set()
        for fn in cls.body:
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            decos = [ast.unparse(d) for d in fn.decorator_list]
            if any(d.endswith((".setter", ".deleter")) or d.endswith("overload") for d in decos):
                continue
            if fn.name in seen:
                out.append(f"{cls.name}.{fn.name} (line {fn.lineno})")
            seen.add(fn.name)
    return out


def test_no_class_defines_a_method_twice():
    """A method defined twice in one class body hides the first (a CUDA backend once shadowed its
    phase-timing mark with a watch helper of the same name, and only timed runs broke)."""
    import ast

    bad = {}
    for name in tracked():
        if name.endswith(".py"):
            got = _defined_twice(ast.parse((ROOT / name).read_text(), name))
            if got:
                bad[name] = got
    assert not bad, bad
    probe = ast.parse("class A:\n    def f(self): pass\n    def f(self, x): pass\n")
    assert _defined_twice(probe) == ["A.f (line 3)"]
