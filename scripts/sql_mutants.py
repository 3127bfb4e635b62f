"""The SQL mutants of one source file: small changes to the SQL text that mutmut never
makes (it mutates Python, and leaves module constants alone), so that a test suite
which still passes with ``tid <= %s`` turned into ``tid < %s``, or a DELETE's condition
made always true, is seen to miss it.  Used by scripts/mutate_sql.

A Python file's SQL is its string literals (implicit concatenations joined) that read
as SQL; an ``.sql`` file is all SQL, its ``--`` comments left alone.  Each mutant is one
change: a comparison turned (``<=`` into ``<``, ``=`` into ``<>``, ...), ``AND`` and
``OR`` swapped, ``NOT`` dropped or ``IS NULL`` negated, ``EXISTS`` and ``IN`` negated,
``MAX`` and ``MIN`` swapped, an order reversed, ``+`` and ``-`` swapped, or one
condition (of a WHERE, a JOIN's ON, a CASE's WHEN, a PL/pgSQL IF) made always true.
"""
from __future__ import annotations

import ast
import dataclasses
import io
import re
import tokenize
from typing import Iterator

SQL_START = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ALTER|DROP|REPLACE|TRUNCATE|LOCK|CALL"
    r"|DO|SET|PRAGMA)\b")
SQL_INSIDE = re.compile(r"\b(WHERE|FROM|JOIN|ORDER BY|GROUP BY|RETURNING|VALUES)\b")
# Where a condition ends, at its own parenthesis depth and outside a CASE it opened.
CONDITION_END = re.compile(
    r"\b(AND|OR|ORDER|GROUP|LIMIT|OFFSET|UNION|RETURNING|ON|FOR|WHEN|THEN|ELSE|END"
    r"|HAVING|WINDOW|LOOP|INTO|USING|SET|FROM|WHERE|SELECT|INSERT|UPDATE|DELETE)\b")


@dataclasses.dataclass(frozen=True)
class Edit:
    start: int          # offsets into the file's text
    end: int
    text: str


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str           # module.OWNER__sql_N (OWNER: the constant, class or function)
    description: str
    edits: tuple[Edit, ...]

    def apply(self, source: str) -> str:
        for edit in sorted(self.edits, key=lambda e: e.start, reverse=True):
            source = source[:edit.start] + edit.text + source[edit.end:]
        return source


@dataclasses.dataclass
class SqlText:
    """One SQL text: what it reads (``text``, with quoted literals, comments and
    f-string fields blanked so nothing inside them is mutated) and, for each of its
    characters, its offset in the file."""
    owner: str
    text: str
    offsets: list[int]


def _blank(text: str, pattern: str) -> str:
    return re.sub(pattern, lambda m: " " * len(m.group()), text, flags=re.S)


def _line_starts(source: str) -> list[int]:
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def _owners(tree: ast.Module) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of each assignment and function, innermost last."""
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id if isinstance(t, ast.Name) else t.attr
                     for t in targets if isinstance(t, (ast.Name, ast.Attribute))]
            if names:
                spans.append((node.lineno, node.end_lineno or node.lineno, names[0]))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            spans.append((node.lineno, node.end_lineno or node.lineno, node.name))
    return spans


def _owner_of(line: int, spans: list[tuple[int, int, str]]) -> str:
    inside = [s for s in spans if s[0] <= line <= s[1]]
    if not inside:
        return "module"
    return min(inside, key=lambda s: s[1] - s[0])[2]


def python_sql(source: str) -> Iterator[SqlText]:
    """The SQL texts of a Python module: each run of adjacent string tokens (one
    expression's implicit concatenation) whose joined value reads as SQL."""
    tree = ast.parse(source)
    docstrings = {node.body[0].value.lineno for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    spans = _owners(tree)
    starts = _line_starts(source)
    run: list[tokenize.TokenInfo] = []
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for token in tokens + [tokenize.TokenInfo(tokenize.ENDMARKER, "", (0, 0), (0, 0), "")]:
        if token.type == tokenize.STRING:
            run.append(token)
            continue
        if token.type in (tokenize.NL, tokenize.COMMENT) and run:
            continue
        if run and run[0].start[0] not in docstrings:
            found = _joined(run, starts, _owner_of(run[0].start[0], spans))
            if found is not None:
                yield found
        run = []


def _joined(run: list[tokenize.TokenInfo], starts: list[int], owner: str) -> SqlText | None:
    text: list[str] = []
    offsets: list[int] = []
    for token in run:
        match = re.match(r"([rRbBfFuU]*)('''|\"\"\"|'|\")", token.string)
        if match is None or "b" in match.group(1).lower():
            return None
        prefix, quote = match.groups()
        inner = token.string[len(match.group()):len(token.string) - len(quote)]
        if "f" in prefix.lower():
            inner = _blank(inner, r"\{[^{}]*\}")
        first = starts[token.start[0] - 1] + token.start[1] + len(match.group())
        text.append(inner)
        offsets.extend(range(first, first + len(inner)))
    joined = "".join(text)
    if not (SQL_START.search(joined) or SQL_INSIDE.search(joined)):
        return None
    return SqlText(owner, _blank(joined, r"'(?:[^']|'')*'"), offsets)


def sql_file(source: str, owner: str) -> Iterator[SqlText]:
    text = _blank(source, r"--[^\n]*")
    text = _blank(text, r"'(?:[^']|'')*'")
    yield SqlText(owner, text, list(range(len(source))))


# -- the operators -----------------------------------------------------------------------------
COMPARISON = re.compile(r"(?<![<>!:=|-])(<=|>=|<>|!=|=|<|>)(?![=<>|])")
TURNED = {"<=": "<", ">=": ">", "<": "<=", ">": ">=", "=": "<>", "<>": "=", "!=": "="}
ASSIGNMENTS = re.compile(r"\bSET\b(.*?)(?=\bWHERE\b|\bFROM\b|\bRETURNING\b|;|$)", re.S)


def _assignment_spans(text: str) -> list[tuple[int, int]]:
    """Where an UPDATE's SET list is (its ``=`` assign; ``ON CONFLICT ... DO UPDATE SET``
    too): comparisons there are not conditions."""
    return [(m.start(1), m.end(1)) for m in ASSIGNMENTS.finditer(text)]


def _closes_between(text: str, index: int) -> bool:
    """Whether the AND at ``index`` is a BETWEEN's (``a BETWEEN x AND y``)."""
    return re.search(r"\bBETWEEN\b(?:(?!\b(?:AND|OR)\b).)*$", text[:index], re.S) is not None


def _simple(sql: SqlText) -> Iterator[tuple[int, int, str, str]]:
    """(start, end, replacement, what) of each one-place change, offsets into sql.text."""
    text = sql.text
    sets = _assignment_spans(text)
    for match in COMPARISON.finditer(text):
        inside_set = any(a <= match.start() < b for a, b in sets)
        # In a SET list only a comparison inside parentheses (a subquery's) is one.
        if inside_set and text[:match.start()].count("(") == text[:match.start()].count(")"):
            continue
        op = match.group(1)
        yield match.start(), match.end(), TURNED[op], f"{op} into {TURNED[op]}"
    for match in re.finditer(r"\b(AND|OR)\b", text):
        after = text[match.end():match.end() + 10].lstrip()
        if match.group() == "OR" and re.match(r"(IGNORE|REPLACE|ROLLBACK|ABORT|FAIL)\b", after):
            continue
        if match.group() == "AND" and _closes_between(text, match.start()):
            continue
        swapped = "OR" if match.group() == "AND" else "AND"
        yield match.start(), match.end(), swapped, f"{match.group()} into {swapped}"
    for match in re.finditer(r"\bNOT\s+", text):
        before = text[max(0, match.start() - 4):match.start()]
        after = text[match.end():match.end() + 7]
        if_not_exists = re.search(r"\bIF\s*$", before) and after.startswith("EXISTS")
        column_not_null = after.startswith("NULL") and not re.search(r"\bIS\s*$", before)
        if if_not_exists or column_not_null:
            continue   # DDL: IF NOT EXISTS, a column's NOT NULL
        yield match.start(), match.end(), "", "NOT dropped"
    for match in re.finditer(r"\bIS\s+NULL\b", text):
        yield match.start(), match.end(), "IS NOT NULL", "IS NULL into IS NOT NULL"
    for match in re.finditer(r"\b(EXISTS|IN)\s*\(", text):
        before = text[max(0, match.start() - 4):match.start()]
        if re.search(r"\bNOT\s*$", before) or re.search(r"\bIF\s*$", before):
            continue
        yield match.start(), match.start(), "NOT ", f"{match.group(1)} negated"
    for match in re.finditer(r"\b(MAX|MIN)\s*\(", text):
        other = "MIN" if match.group(1) == "MAX" else "MAX"
        yield match.start(), match.start() + 3, other, f"{match.group(1)} into {other}"
    for match in re.finditer(r"\b(DESC|ASC)\b", text):
        other = "ASC" if match.group() == "DESC" else "DESC"
        yield match.start(), match.end(), other, f"{match.group()} into {other}"
    for match in re.finditer(r"\bORDER BY\s+([\w.]+)(?=\s*(,|\)|LIMIT\b|OFFSET\b|FOR\b|$|;))",
                             text):
        yield match.end(1), match.end(1), " DESC", "ORDER BY ... DESC"
    for match in re.finditer(r"(?<=\s)([+-])(?=\s)", text):
        other = "-" if match.group() == "+" else "+"
        yield match.start(), match.end(), other, f"{match.group()} into {other}"


def _case_depths(text: str) -> list[int]:
    """The CASE nesting at each character."""
    depths, depth, last = [], 0, 0
    for match in re.finditer(r"\b(CASE|END)\b", text):
        depths.extend([depth] * (match.start() - last))
        if match.group() == "CASE":
            depth += 1
        elif depth:
            depth -= 1
        last = match.start()
    depths.extend([depth] * (len(text) - last + 1))
    return depths


def _condition_end(text: str, start: int, until_then: bool) -> int | None:
    depth, case, index = 0, 0, start
    while index < len(text):
        char = text[index]
        if char == "(":
            depth += 1
        elif char == ")":
            if depth == 0:
                break
            depth -= 1
        elif char == ";" and depth == 0:
            break
        elif depth == 0 and (index == 0 or not (text[index - 1].isalnum()
                                                or text[index - 1] == "_")):
            match = CONDITION_END.match(text, index)
            word = re.match(r"\w+", text[index:])
            if word and word.group() == "CASE":
                case += 1
            elif match and case and match.group() == "END":
                case -= 1
            elif match and not case:
                if match.group() == "AND" and _closes_between(text[start:], index - start):
                    index += 3
                    continue
                break
            if word:
                index += len(word.group())
                continue
        index += 1
    end = index
    while end > start and text[end - 1].isspace():
        end -= 1
    if end <= start:
        return None
    if until_then and not text.startswith("THEN", index):
        return None
    return end


def _conditions(sql: SqlText) -> Iterator[tuple[int, int, str]]:
    """(start, end, what) of each condition that can be made always true."""
    text = sql.text
    cases = _case_depths(text)
    starts: list[tuple[int, bool, str]] = []
    for match in re.finditer(r"\b(WHERE|HAVING|AND|OR)\s+", text):
        if match.group(1) == "OR" and re.match(r"(IGNORE|REPLACE)\b", text[match.end():]):
            continue
        if match.group(1) == "AND" and _closes_between(text, match.start()):
            continue
        starts.append((match.end(), False, match.group(1)))
    for match in re.finditer(r"\bJOIN\s+[\w.]+(\s+(AS\s+)?(?!ON\b)\w+)?\s+ON\s+", text):
        starts.append((match.end(), False, "JOIN ... ON"))
    for match in re.finditer(r"\bWHEN\s+", text):
        if cases[match.start()]:
            starts.append((match.end(), False, "WHEN"))
    for match in re.finditer(r"\b(IF|ELSIF|WHILE)\s+", text):
        starts.append((match.end(), True, match.group(1)))
    for start, until_then, keyword in sorted(set(starts)):
        end = _condition_end(text, start, until_then)
        if end is not None and not re.fullmatch(r"\s*(TRUE|true|1\s*=\s*1)\s*", text[start:end]):
            yield start, end, keyword


def mutants(module: str, path: str, source: str) -> list[Mutant]:
    if path.endswith(".sql"):
        owner = path.rsplit("/", 1)[-1].removesuffix(".sql")
        texts = list(sql_file(source, owner))
    else:
        texts = list(python_sql(source))
    found: list[Mutant] = []
    counts: dict[str, int] = {}

    def add(sql: SqlText, edits: list[tuple[int, int, str]], what: str) -> None:
        file_edits = []
        for a, b, text in edits:
            if b > a:
                if sql.offsets[b - 1] - sql.offsets[a] != b - 1 - a:
                    return      # across two string literals: not one place in the file
                file_edits.append(Edit(sql.offsets[a], sql.offsets[b - 1] + 1, text))
            elif text == "(" or a == 0:
                file_edits.append(Edit(sql.offsets[a], sql.offsets[a], text))
            else:       # right after the character before: in its literal
                file_edits.append(Edit(sql.offsets[a - 1] + 1, sql.offsets[a - 1] + 1, text))
        counts[sql.owner] = counts.get(sql.owner, 0) + 1
        first = min(a for a, _, _ in edits)
        last = max(b for _, b, _ in edits)
        excerpt = " ".join(sql.text[max(0, first - 25):last + 25].split())
        found.append(Mutant(f"{module}.{sql.owner}__sql_{counts[sql.owner]}",
                            f"{what}: ...{excerpt}...", tuple(file_edits)))

    for sql in texts:
        changes = sorted([(a, b, [(a, b, t)], what) for a, b, t, what in _simple(sql)]
                         + [(a, b, [(a, a, "("), (b, b, " OR 1 = 1)")],
                             f"{kw} condition always true")
                            for a, b, kw in _conditions(sql)],
                         key=lambda c: (c[0], c[1], c[3]))
        for _, _, edits, what in changes:
            add(sql, edits, what)
    return found
