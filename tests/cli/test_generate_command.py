"""``dgemma-struct generate``: one spec from the shell. The value goes to stdout (JSON for a schema, the
text otherwise), exit 0; no valid output is exit 1; bad usage or input is one ``error:`` line, exit 2.
Runs ``main()`` in-process (one model load for the file) and the real console entry point once."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import jsonschema
import pytest

from dgemma_struct.cli import main
from dgemma_struct.testing import embedded_model_available

pytestmark = pytest.mark.skipif(not embedded_model_available(), reason="embedded checkpoint missing")

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "email": {"type": "string"}},
          "required": ["name", "age", "email"], "additionalProperties": False}
PERSON_PROMPT = ("Extract the name, age and email as JSON.\nAlice Gomez is 51 years old and can be reached at "
                 "alice44@example.com.")
PHONE = r"\d{3}-\d{3}-\d{4}"


def _cli(capsys, monkeypatch, args: list[str], stdin: str = "") -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    try:
        rc = main(["generate", "--device", "cpu", *args])
    except SystemExit as stop:  # argparse
        rc = stop.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def _one_error_line(err: str, needle: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert needle in lines[0], lines[0]


def test_grounded_regex_prints_the_number_from_stdin(capsys, monkeypatch):
    rc, out, err = _cli(capsys, monkeypatch, ["--regex", PHONE, "--grounded", "-"], stdin="Call 555-867-5309\n")
    assert (rc, out) == (0, "555-867-5309\n"), err


def test_schema_file_prints_valid_json_with_stats_on_stderr(capsys, monkeypatch, tmp_path):
    (tmp_path / "person.json").write_text(json.dumps(PERSON))
    rc, out, err = _cli(capsys, monkeypatch, ["--schema", str(tmp_path / "person.json"), "--verbose", PERSON_PROMPT])
    assert rc == 0, err
    value = json.loads(out)
    jsonschema.validate(value, PERSON)
    assert value["age"] == 51
    assert err.startswith("stats: ") and "forward passes" in err


def test_model_class_from_the_current_directory(capsys, monkeypatch, tmp_path):
    (tmp_path / "cli_models_mod.py").write_text(
        "from pydantic import BaseModel\n\nclass Person(BaseModel):\n    name: str\n    age: int\n    email: str\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    rc, out, err = _cli(capsys, monkeypatch, ["--model-class", "cli_models_mod:Person", "-"], stdin=PERSON_PROMPT)
    assert rc == 0, err
    assert set(json.loads(out)) == {"name", "age", "email"}


def test_choice_and_json_lines_run_as_one_batch(capsys, monkeypatch):
    lines = [json.dumps("Classify the sentiment as positive, negative or neutral.\nThe room was dirty and loud."),
             json.dumps({"prompt": "Classify the sentiment as positive, negative or neutral.\nThe hotel was clean "
                                   "and the view was amazing."})]
    rc, out, err = _cli(capsys, monkeypatch, ["--choice", "positive,negative,neutral", "--json-lines", "--verbose"],
                        stdin="\n".join(lines) + "\n")
    assert rc == 0, err
    values = [json.loads(ln) for ln in out.splitlines()]
    assert len(values) == 2 and set(values) <= {"positive", "negative", "neutral"}
    assert err.count("stats: ") == 2


def test_grounded_schema_with_a_source_file_prints_value_and_spans(capsys, monkeypatch, tmp_path):
    doc = "Alice Gomez is 51 years old and can be reached at alice44@example.com."
    (tmp_path / "doc.txt").write_text(doc)
    (tmp_path / "person.json").write_text(json.dumps(PERSON))
    rc, out, err = _cli(capsys, monkeypatch, ["--schema", str(tmp_path / "person.json"), "--source",
                                              str(tmp_path / "doc.txt"), "Extract the name, age and email as JSON."])
    assert rc == 0, err
    shown = json.loads(out)
    jsonschema.validate(shown["value"], PERSON)
    for span in shown["spans"]:
        assert doc[span["start"]:span["end"]] == span["text"]


def test_no_valid_output_is_exit_1(capsys, monkeypatch, tmp_path):
    (tmp_path / "person.json").write_text(json.dumps(PERSON))
    rc, out, err = _cli(capsys, monkeypatch, ["--schema", str(tmp_path / "person.json"), "--max-new-tokens", "3",
                                              PERSON_PROMPT])
    assert (rc, out) == (1, ""), err
    _one_error_line(err, "")


USAGE = [
    ([PERSON_PROMPT], "exactly one of"),
    (["--regex", "a", "--choice", "a,b", "x"], "exactly one of"),
    (["--schema", "/nonexistent/schema.json", "x"], "/nonexistent/schema.json"),
    (["--grammar", "/nonexistent/g.lark", "x"], "/nonexistent/g.lark"),
    (["--model-class", "no_such_module_xyz:Thing", "x"], "no_such_module_xyz"),
    (["--model-class", "json:NoSuchClass", "x"], "NoSuchClass"),
    (["--choice", "a,b", "--grounded", "x"], "grounded output needs"),
    (["--regex", "(", "x"], "regex"),
    (["--regex", "a", "--max-new-tokens", "0", "x"], "--max-new-tokens"),
    (["--regex", "a", "--mode", "beam", "x"], "invalid choice"),
    (["--regex", "a", "--json-lines"], "no prompt"),
]


@pytest.mark.parametrize("args,needle", USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_usage_errors_are_one_line_exit_2(args, needle, capsys, monkeypatch):
    rc, out, err = _cli(capsys, monkeypatch, args)
    assert rc == 2 and out == "", (rc, out, err)
    _one_error_line(err, needle)


def test_bad_schema_json_is_exit_2(capsys, monkeypatch, tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    rc, _, err = _cli(capsys, monkeypatch, ["--schema", str(tmp_path / "bad.json"), "x"])
    assert rc == 2
    _one_error_line(err, "not JSON")


def test_console_entry_point_reads_stdin():
    """The real command, as a shell runs it (its imports, stdin, stdout and exit status)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "dgemma_struct.cli", "generate", "--device", "cpu", "--regex", PHONE,
                           "--grounded", "-"], input="Call 555-867-5309", capture_output=True, text=True,
                          timeout=600, env=env)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "555-867-5309\n", "")


def test_confidence_prints_value_and_per_field_confidence(capsys, monkeypatch, tmp_path):
    (tmp_path / "person.json").write_text(json.dumps(PERSON))
    rc, out, err = _cli(capsys, monkeypatch, ["--schema", str(tmp_path / "person.json"), "--confidence", PERSON_PROMPT])
    assert rc == 0, err
    shown = json.loads(out)
    jsonschema.validate(shown["value"], PERSON)
    assert set(shown["confidence"]) == {"/name", "/age", "/email"}
    assert all(0.0 <= p <= 1.0 for p in shown["confidence"].values())
