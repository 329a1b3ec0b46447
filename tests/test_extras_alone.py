"""What a framework-only install (`ampkit[langchain]`, no server extra) gets: in-process URLs
search by keywords with a warning naming the extra, and the `ampkit` command names the extra
instead of crashing. The real check, a clean venv per extra, is .ci/extras.sh; these keep
the two behaviours from regressing in the ordinary test run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

HIDE = "import sys; sys.modules.update({name: None for name in sys.argv[1:]})\n"


def run(code: str, *hidden: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE + textwrap.dedent(code), *hidden],
                          capture_output=True, text=True, timeout=120)


def test_in_process_urls_work_without_model2vec(tmp_path):
    out = run(f"""
        import warnings, ampkit
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with ampkit.connect("sqlite:///{tmp_path}/m.db", agent_id="a") as memory:
                memory.remember("Ada prefers green tea", owner_id="ada")
                print([h.cell.content.text for h in memory.search("green tea", owner_id="ada")])
        print([str(w.message) for w in caught if "model2vec" in str(w.message)])
    """, "model2vec")
    assert out.returncode == 0, out.stderr
    hits, warned = out.stdout.strip().splitlines()
    assert hits == "['Ada prefers green tea']"
    assert "ampkit[server]" in warned


def test_the_ampkit_command_names_the_missing_extra():
    out = run("from ampkit.cli import main; main()", "click")
    assert out.returncode == 1
    assert "pip install -e '.[server]'" in out.stderr and "Traceback" not in out.stderr


def test_a_command_whose_server_modules_are_missing_names_the_extra(tmp_path):
    out = run(f"""
        import sys
        sys.argv = ["ampkit", "serve", "--port", "0", "--store", "sqlite:///{tmp_path}/m.db"]
        from ampkit.cli import main
        main()
    """, "uvicorn", "fastapi")
    assert out.returncode == 1, out.stderr
    assert "pip install -e '.[server]'" in out.stderr and "Traceback" not in out.stderr
