"""The documentation stays inside the repository and in step with the code.

- No tracked file points at the old design brief outside the repository.
- Every property of the case JSON Schema carries a description, and the schema command writes exactly the source.
- Every schema field has a row in docs/cases.md, every registered check a section in docs/checks.md.
- README links the design pages; every relative link in README.md, docs/*.md and notes/*.md resolves, anchors included.
- README's layout table has a row for each top-level folder git tracks, and none for a folder that is not there.
- docs/environment.md has a row for every environment variable the product code reads, and none for another.

Each helper is shown to report what it exists to catch (the ``*_reports_*`` tests), so none can pass vacuously.
"""

from __future__ import annotations

import ast
import copy
import fnmatch
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from harness import cli
from harness.cases.schema import SCHEMA, schema_json
from harness.checks import check_names

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# Spelled in pieces so that this file does not contain what it forbids.
OUTSIDE_POINTERS = ("DESIGN" + ".md", "DESIGN" + " section", "../" + "shared")
DESIGN_PAGES = ("docs/cases.md", "docs/checks.md", "docs/provider.md")


# ---------------------------------------------------------------- helpers


def own_checkout(root: Path) -> bool:
    """Whether ``root`` is the top of a git checkout of its own (not an export, nor a folder inside another
    repository, where git would answer for the enclosing repository's files)."""
    try:
        proc = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, check=False)
    except FileNotFoundError:
        return False
    return proc.returncode == 0 and Path(proc.stdout.decode().strip()).resolve() == root.resolve()


def ignore_rules(root: Path) -> list[tuple[str, bool, bool]]:
    """``root``'s .gitignore as (pattern, anchored at the root, folders only); comments and blanks dropped. The
    patterns this repository uses: names and globs, a leading ``/`` anchors, a trailing ``/`` means a folder."""
    path = root / ".gitignore"
    rules = []
    for line in (path.read_text().splitlines() if path.is_file() else []):
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.strip("/"), line.startswith("/"), line.endswith("/")))
    return rules


def ignored(relative: Path, is_dir: bool, rules: list[tuple[str, bool, bool]]) -> bool:
    for pattern, anchored, folders_only in rules:
        if folders_only and not is_dir:
            continue
        if fnmatch.fnmatch(relative.as_posix() if anchored else relative.name, pattern):
            return True
    return False


def tree_files(root: Path) -> list[Path]:
    """The files of a source tree that is not its own git checkout: every file under ``root`` but ``.git`` and
    what ``root``'s .gitignore names (what ``git ls-files`` would list once the tree is committed)."""
    rules, found = ignore_rules(root), []
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if d != ".git" and not ignored((here / d).relative_to(root), True, rules))
        found += [here / f for f in sorted(files) if f != ".git"
                  and not ignored((here / f).relative_to(root), False, rules)]
    return found


def project_files(root: Path) -> list[Path]:
    """The repository's files: git's tracked files (that exist in the working tree) in a checkout of its own, else
    the tree itself (``tree_files``): a source export (``git archive``), also one unpacked inside another
    repository, as a vendored copy is."""
    if not own_checkout(root):
        return tree_files(root)
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True)
    names = [n for n in proc.stdout.decode().split("\0") if n]
    return [root / n for n in names if (root / n).is_file()]


def outside_pointers(texts: dict[str, str]) -> list[str]:
    """``file:line: phrase`` for every line that points outside the repository."""
    found = []
    for name, text in texts.items():
        for number, line in enumerate(text.splitlines(), 1):
            for phrase in OUTSIDE_POINTERS:
                if phrase in line:
                    found.append(f"{name}:{number}: {phrase}")
    return found


def schema_properties(schema: dict) -> list[tuple[str, dict]]:
    """(field path, schema node) of every property under the schema's definitions, recursively.

    Paths as docs/cases.md names them: ``shape.nheads``, ``sequences[].context``, ``expect.xfail`` (a property
    of an ``anyOf`` branch belongs to the field the branch describes). ``$ref`` nodes are not followed: the
    referenced definition is walked itself."""
    out: list[tuple[str, dict]] = []

    def walk(node, prefix: str) -> None:
        if not isinstance(node, dict):
            return
        for key, sub in node.get("properties", {}).items():
            path = prefix + key
            out.append((path, sub))
            walk(sub, path + ".")
        items = node.get("items")
        if isinstance(items, dict) and "properties" in items:
            walk(items, prefix.rstrip(".") + "[].")
        for branch in node.get("anyOf", ()):
            walk(branch, prefix)

    for definition in schema.get("$defs", {}).values():
        walk(definition, "")
    walk(schema, "")
    return out


def missing_descriptions(schema: dict) -> list[str]:
    """Field paths whose schema node has no non-empty ``description``."""
    return sorted({path for path, node in schema_properties(schema)
                   if not (isinstance(node.get("description"), str) and node["description"].strip())})


def field_rows(doc: str) -> set[str]:
    """Field names in the first cell of a markdown table row: ``| `shape.nheads` | ...``."""
    return set(re.findall(r"^\|\s*`([^`]+)`\s*\|", doc, re.M))


def undocumented_fields(doc: str, paths) -> list[str]:
    rows = field_rows(doc)
    return sorted(set(paths) - rows)


def undocumented_checks(doc: str, names) -> list[str]:
    """Check names without a ``### `name` `` section."""
    sections = set(re.findall(r"^###\s+`([^`]+)`\s*$", doc, re.M))
    return [n for n in names if n not in sections]


def _outside_fences(text: str) -> str:
    """The text with fenced code blocks blanked (headings and links there are code, not markdown)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            kept.append("")
            continue
        kept.append("" if fenced else line)
    return "\n".join(kept)


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors for the headings of a markdown text (lower case, punctuation dropped, spaces to hyphens;
    a repeated heading gets -1, -2, ...)."""
    anchors: set[str] = set()
    for title in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", _outside_fences(text), re.M):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in anchors:
            n += 1
            candidate = f"{slug}-{n}"
        anchors.add(candidate)
    return anchors


def relative_links(text: str) -> list[str]:
    """Targets of markdown links that are not URLs (``[x](path#anchor)``), outside code blocks."""
    targets = re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", _outside_fences(text))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def broken_links(page: Path, text: str) -> list[str]:
    """``target: why`` for every relative link of ``page`` whose file or heading anchor does not exist."""
    problems = []
    for target in relative_links(text):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            problems.append(f"{target}: no such file {file}")
            continue
        if anchor:
            if file.suffix != ".md" or file.is_dir():
                problems.append(f"{target}: anchor into a file that is not markdown")
            elif anchor not in heading_anchors(file.read_text() if file != page else text):
                problems.append(f"{target}: no heading with anchor #{anchor} in {file.name}")
    return problems


def markdown_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted((ROOT / "notes").glob("*.md"))]


# ---------------------------------------------------------------- (a) nothing points outside


def test_no_tracked_file_points_outside_the_repository():
    texts = {str(p.relative_to(ROOT)): p.read_bytes().decode("utf-8", errors="replace") for p in project_files(ROOT)}
    assert len(texts) > 50, f"only {len(texts)} tracked files: the listing is wrong"
    assert outside_pointers(texts) == []


def test_outside_pointer_check_reports_each_phrase():
    texts = {"a.py": "x = 1\n# see " + OUTSIDE_POINTERS[1] + " 4\n", "b.md": "[d](" + OUTSIDE_POINTERS[2] + "/x)\n",
             "c.txt": "the " + OUTSIDE_POINTERS[0] + " file\n", "ok.md": "see docs/exactness.md\n"}
    assert outside_pointers(texts) == [
        f"a.py:2: {OUTSIDE_POINTERS[1]}", f"b.md:1: {OUTSIDE_POINTERS[2]}", f"c.txt:1: {OUTSIDE_POINTERS[0]}"]


# ---------------------------------------------------------------- (b) schema descriptions


def test_every_schema_property_has_a_description():
    paths = [p for p, _ in schema_properties(SCHEMA)]
    assert {"schema", "cases", "shape.nheads", "sequences[].final_slot", "expect.xfail", "tiers.cpu"} <= set(paths)
    assert missing_descriptions(SCHEMA) == []


def test_missing_description_is_reported():
    schema = copy.deepcopy(SCHEMA)
    del schema["$defs"]["case"]["properties"]["sequences"]["items"]["properties"]["context"]["description"]
    schema["$defs"]["case"]["properties"]["expect"]["anyOf"][1]["properties"]["xfail"]["description"] = " "
    assert missing_descriptions(schema) == ["expect.xfail", "sequences[].context"]


def test_schema_command_writes_the_source_with_its_descriptions(tmp_path, capsys):
    out = tmp_path / "schema.json"
    assert cli.main(["schema", "--out", str(out)]) == 0
    assert out.read_text() == schema_json()
    assert f"wrote {out}" in capsys.readouterr().out


# ---------------------------------------------------------------- (c) docs name every field and check


def test_cases_page_has_a_row_for_every_schema_field():
    paths = {p for p, _ in schema_properties(SCHEMA)}
    assert len(paths) > 40
    assert undocumented_fields((DOCS / "cases.md").read_text(), paths) == []


def test_undocumented_field_is_reported():
    doc = (DOCS / "cases.md").read_text()
    without = "\n".join(line for line in doc.splitlines() if not line.startswith("| `cache.row_pad` |"))
    paths = {p for p, _ in schema_properties(SCHEMA)}
    assert undocumented_fields(without, paths) == ["cache.row_pad"]
    # a field named only in prose or in a longer path's row is not documented
    assert undocumented_fields("the `nheads` field\n| `shape.nheads.x` | int |\n", ["shape.nheads"]) == ["shape.nheads"]


def test_checks_page_has_a_section_for_every_registered_check():
    names = check_names()
    assert len(names) >= 10
    assert undocumented_checks((DOCS / "checks.md").read_text(), names) == []


def test_undocumented_check_is_reported():
    doc = (DOCS / "checks.md").read_text().replace("### `masked_state`\n", "### masked state\n")
    assert undocumented_checks(doc, check_names()) == ["masked_state"]
    assert undocumented_checks("### `a`\n", ["a", "b"]) == ["b"]


# ---------------------------------------------------------------- (d) links


def test_readme_links_the_design_pages():
    links = {target.partition("#")[0] for target in relative_links((ROOT / "README.md").read_text())}
    for page in DESIGN_PAGES:
        assert page in links, f"README.md does not link {page}"
        assert (ROOT / page).is_file(), f"README.md links {page}, which does not exist"


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    text = page.read_text()
    assert broken_links(page, text) == []


def test_broken_links_are_reported():
    page = DOCS / "checks.md"
    text = ("[a](cases.md) [b](cases.md#expect-and-xfail) [c](nowhere.md) [d](cases.md#no-such-heading) "
            "[e](#tiers) [f](#not-here) [g](https://example.org/x.md)\n```\n[h](in-code.md)\n```\n")
    problems = broken_links(page, text + "\n## Tiers\n")
    assert [p.split(":")[0] for p in problems] == ["nowhere.md", "cases.md#no-such-heading", "#not-here"]


def test_heading_anchors_follow_githubs_rules():
    text = "# Checks, guards and tiers\n## `gather_exact`\n## A (b/c)\n## A (b/c)\n```\n# not a heading\n```\n"
    assert heading_anchors(text) == {"checks-guards-and-tiers", "gather_exact", "a-bc", "a-bc-1"}


def layout_rows(readme: str) -> set[str]:
    """The folders README's layout table names (its ``| `name/` | ... |`` rows)."""
    return set(re.findall(r"^\| `([^`/]+)/` \|", readme, re.MULTILINE))


def test_readme_layout_table_matches_the_tree():
    folders = {p.relative_to(ROOT).parts[0] for p in project_files(ROOT) if len(p.relative_to(ROOT).parts) > 1}
    folders = {f for f in folders if not f.startswith(".")}  # .ci/, .github/: CI's own files
    assert layout_rows((ROOT / "README.md").read_text()) == folders


def test_the_tree_listing_applies_gitignore_as_git_would(tmp_path):
    """Outside a checkout of its own the files are read from the tree: .gitignore's names, globs, anchored and
    folder-only patterns keep build outputs out, as ``git ls-files`` would."""
    (tmp_path / ".gitignore").write_text("# comment\n.venv/\n__pycache__/\n*.pyc\n/reports/\n/.peers\n")
    for name in ("a.py", "docs/b.md", ".venv/lib/x.py", "pkg/__pycache__/c.pyc", "pkg/d.pyc", "reports/r.json",
                 "docs/reports/kept.md", ".peers/ops.py", ".git/HEAD", "pkg/.venv"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    listed = {p.relative_to(tmp_path).as_posix() for p in tree_files(tmp_path)}
    # pkg/.venv is a file, and ".venv/" names folders only
    assert listed == {".gitignore", "a.py", "docs/b.md", "docs/reports/kept.md", "pkg/.venv"}
    assert not own_checkout(tmp_path)


EXPORT_TESTS = ("test_no_tracked_file_points_outside_the_repository", "test_readme_layout_table_matches_the_tree")


def test_the_tree_checks_hold_on_a_source_export_inside_another_repository(tmp_path):
    """A vendored copy: this tree exported with ``git archive`` (the working tree's tracked changes included, via
    ``git stash create``) and unpacked into a folder of a throwaway git repository; there the two checks that list
    the repository's files must list the export's, not the enclosing repository's, and pass."""
    if not own_checkout(ROOT):
        pytest.skip("exporting needs this tree to be a git checkout of its own (it is an export already)")
    outer = tmp_path / "outer"
    (outer / "vendor").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    (outer / "unrelated.txt").write_text("x")
    subprocess.run(["git", "-C", str(outer), "add", "unrelated.txt"], check=True)
    snapshot = subprocess.run(["git", "stash", "create"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip() or "HEAD"
    archive = tmp_path / "export.tar"
    subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), snapshot], cwd=ROOT, check=True)
    export = outer / "vendor" / "ssd"
    with tarfile.open(archive) as tar:
        tar.extractall(export, filter="data")
    env = {**os.environ, "PYTHONPATH": str(export)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-rs",
                          "tests/test_docs.py", "-k", " or ".join(EXPORT_TESTS)], cwd=export, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]


def scripts_row_names(readme: str) -> set[str]:
    """The file names README's ``scripts/`` row names in backticks (``gpu_run.sh``, ...)."""
    row = re.search(r"^\| `scripts/` \|(.*)\|$", readme, re.MULTILINE)
    return set(re.findall(r"`([^`/ ]+\.[a-z]+)`", row.group(1))) if row else set()


def test_scripts_holds_the_tools_readme_names_and_nothing_else():
    """scripts/ keeps operational tools only, each named in README's layout row (a lab or probe added there shows up
    as a file the row does not name)."""
    present = {p.name for p in project_files(ROOT) if p.parent == ROOT / "scripts"}
    assert present == scripts_row_names((ROOT / "README.md").read_text())


def test_scripts_row_check_reads_the_names():
    row = "| `scripts/` | tools: `gpu_run.sh` (one call), `fit.py`, `d.json` |\n| `x/` | `not_this.py` |\n"
    assert scripts_row_names(row) == {"gpu_run.sh", "fit.py", "d.json"}
    assert scripts_row_names("| `other/` | `a.py` |\n") == set()


def test_layout_check_reports_a_missing_and_a_stale_row():
    table = "| path | what |\n| --- | --- |\n| `kernels/` | ours |\n| `gone/` | removed |\n"
    assert layout_rows(table) == {"kernels", "gone"}
    assert layout_rows(table) != {"kernels", "gone", "scripts"}  # a folder without a row
    assert layout_rows(table) != {"kernels"}  # a row without a folder


# ---------------------------------------------------------------- (f) one table of environment variables

PRODUCT_TREES = ("harness", "kernels", "reference", "ssd_pytest", "peers")
# os.environ.get / os.getenv / os.environ.setdefault (a default the caller may set first)
READS = {"get", "getenv", "setdefault"}


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (isinstance(node, ast.Name)
                                                                           and node.id == "environ")


def variables_read(sources: dict[str, str]) -> set[str]:
    """The environment variables ``sources`` (path -> Python text) read: the first argument of
    ``os.environ.get``/``os.getenv``/``os.environ.setdefault``, an ``os.environ[...]`` load and an ``in os.environ``
    test, each a string literal or a module-level ``NAME = "LITERAL"`` of any of the sources (also as
    ``module.NAME``). Writes (``os.environ[X] = ...``, ``pop``) are not reads."""
    trees = {path: ast.parse(text) for path, text in sources.items()}
    constants = {target.id: node.value.value for tree in trees.values() for node in tree.body
                 if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                 and isinstance(node.value.value, str) for target in node.targets if isinstance(target, ast.Name)}

    def name_of(expr: ast.AST) -> str | None:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return expr.value
        if isinstance(expr, ast.Name | ast.Attribute):
            return constants.get(expr.id if isinstance(expr, ast.Name) else expr.attr)
        return None

    found: set[str | None] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                func = node.func
                if func.attr in READS and (_is_environ(func.value) or func.attr == "getenv"):
                    found.add(name_of(node.args[0]))
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_environ(node.value):
                found.add(name_of(node.slice))
            elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In | ast.NotIn) \
                    and _is_environ(node.comparators[0]):
                found.add(name_of(node.left))
    if None in found:
        raise AssertionError("an environment read whose variable name is not a literal or a module-level constant")
    return found


def documented_variables(doc: str) -> list[str]:
    """The variables docs/environment.md's table rows name (a row's first cell, in backticks)."""
    return re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|", doc, flags=re.M)


def environment_gaps(read: set[str], doc: str) -> list[str]:
    rows = documented_variables(doc)
    return ([f"{name}: read by the code, no row in docs/environment.md" for name in sorted(read - set(rows))]
            + [f"{name}: a row in docs/environment.md, read by nothing" for name in sorted(set(rows) - read)]
            + [f"{name}: more than one row" for name in sorted({n for n in rows if rows.count(n) > 1})])


def product_sources() -> dict[str, str]:
    return {str(path.relative_to(ROOT)): path.read_text() for tree in PRODUCT_TREES
            for path in sorted((ROOT / tree).rglob("*.py"))}


def test_environment_page_lists_every_variable_the_code_reads():
    read = variables_read(product_sources())
    assert {"SSD_PDL", "SSD_HARNESS_ISOLATION", "TRITON_INTERPRET"} <= read  # the reader sees the code's reads
    assert environment_gaps(read, (DOCS / "environment.md").read_text()) == []


def test_environment_check_reports_a_missing_a_stale_and_a_twice_listed_row():
    source = ("import os\nNAME_ENV = 'SSD_A'\n"
              "a = os.environ.get(NAME_ENV)\nb = os.getenv('SSD_B')\nc = os.environ['SSD_C']\n"
              "d = 'SSD_D' in os.environ\nos.environ.setdefault('SSD_E', '1')\n"
              "os.environ['SSD_WRITTEN'] = '1'\nos.environ.pop('SSD_POPPED', None)\n")
    read = variables_read({"m.py": source})
    assert read == {"SSD_A", "SSD_B", "SSD_C", "SSD_D", "SSD_E"}
    doc = "| `SSD_A` | x |\n| `SSD_B` | x |\n| `SSD_C` | x |\n| `SSD_D` | x |\n| `SSD_D` | y |\n| `SSD_STALE` | x |\n"
    assert environment_gaps(read, doc) == ["SSD_E: read by the code, no row in docs/environment.md",
                                           "SSD_STALE: a row in docs/environment.md, read by nothing",
                                           "SSD_D: more than one row"]
    with pytest.raises(AssertionError, match="not a literal"):
        variables_read({"m.py": "import os\nos.environ.get(f'SSD_{1}')\n"})
