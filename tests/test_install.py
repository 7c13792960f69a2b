"""What a user gets from `pip install .` (no editable source tree), and CI's rule that a skip is a failure."""
import glob
import os
import shutil
import subprocess
import sys

import pytest

import conftest

pytest_plugins = ["pytester"]


def _source_copy(dest):
    """The repository as a clean clone has it: no dot-directories, build outputs or caches."""
    def ignore(d, names):
        top = os.path.samefile(d, conftest.ROOT)
        return [n for n in names if n.startswith(".") or n.endswith(".egg-info") or n == "__pycache__"
                or (top and n in ("build", "runs", "data"))]

    shutil.copytree(conftest.ROOT, dest, ignore=ignore)


def test_presets_after_a_plain_pip_install(tmp_path):
    """A wheel installed alone (PYTHONPATH, the venv's dependencies) reads presets from outside the repository."""
    src, site, work = tmp_path / "src", tmp_path / "site", tmp_path / "work"
    _source_copy(src)
    packages = {os.path.relpath(d, src) for d, _, files in os.walk(src) if "__init__.py" in files}
    pip = [sys.executable, "-m", "pip", "-q", "--no-input"]
    proc = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", tmp_path, src],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    wheel = glob.glob(f"{tmp_path}/*.whl")
    proc = subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", site, *wheel],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    installed = {os.path.relpath(d, site) for d, _, files in os.walk(site) if "__init__.py" in files}
    assert packages == installed  # pyproject.toml lists its packages by hand
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    check = ("import os, pretrain, pretrain.config as c, ptm; slurm = ptm.shipped('slurm', 'slurm'); "
             f"assert pretrain.__file__.startswith({str(site)!r}) and c.PRESETS_DIR.startswith({str(site)!r}) "
             "and os.path.isfile(os.path.join(c.PRESETS_DIR, 'bert-tiny.yaml')), (pretrain.__file__, c.PRESETS_DIR); "
             f"assert slurm.startswith({str(site)!r}) and os.path.isfile(os.path.join(slurm, 'pretrain.sbatch')), slurm")
    proc = subprocess.run([sys.executable, "-c", check], cwd=work, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "pretrain", "plan", "--config", "bert-tiny", "--gpu", "h100",
                           "--gpus", "2"], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # bert-tiny's own values over its base bert-base.yaml: 2 layers, micro batch 16, seq_len 64; the GPU catalog
    assert "micro batch 16 x 64 tokens" in proc.stdout and "0/2 layers" in proc.stdout, proc.stdout
    assert "predicted speed on 2 x h100" in proc.stdout, proc.stdout


@pytest.mark.parametrize("ci", ["true", None])
def test_ci_turns_skips_into_failures(pytester, monkeypatch, ci):
    """With CI=true a skip in a test, a fixture or at import fails with its reason; xfail stays xfail."""
    if ci:
        monkeypatch.setenv("CI", ci)
    else:
        monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(test_module_skip='import pytest\npytest.importorskip("no_such_module", reason="foo missing")',
                        test_skips="""
        import pytest

        @pytest.fixture
        def component():
            pytest.skip("bar not installed")

        def test_skip():
            pytest.skip("baz not installed")

        def test_fixture_skip(component):
            pass

        @pytest.mark.xfail(reason="known")
        def test_xfail():
            assert False
    """)
    result = pytester.runpytest("--continue-on-collection-errors", plugins=[conftest])
    if ci:
        result.assert_outcomes(failed=1, errors=2, xfailed=1)
        for reason in ("foo missing", "bar not installed", "baz not installed"):
            result.stdout.fnmatch_lines([f"*{reason} ({conftest.CI_HINT})*"])
    else:  # listed at the end with their reasons
        result.assert_outcomes(skipped=3, xfailed=1)
        result.stdout.fnmatch_lines(["*3 skipped here (with CI=true they fail)*", "*1 x *missing*",
                                     "*1 x *not installed*", "*1 x *not installed*"])
