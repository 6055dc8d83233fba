"""deploy/'s manifests and units, checked as the systems that run them would: the KubeRay files
against KubeRay's own CRD schemas (v1.7.0, in deploy/schemas/), the Kubernetes objects against
Kubernetes' schemas (kubernetes-validate), both strict (an unknown field is an error, as with
`kubectl apply --validate=strict`), the systemd units with `systemd-analyze verify`; and every
command they run parses as ours, naming files that exist."""

import gzip
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from orchestrator.cli.parser import build_parser

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUBERNETES = "1.33"  # what kubernetes-validate checks against: a release current clusters run


def documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def strict(schema):
    """A CRD's structural schema as `--validate=strict` applies it: objects with listed properties
    and no `additionalProperties` (or preserve-unknown-fields) take no others."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [strict(s) for s in schema]
    return schema


def crd_schema(plural: str) -> dict:
    crd = yaml.safe_load(gzip.open(DEPLOY / "schemas" / f"ray.io_{plural}.v1.7.0.yaml.gz"))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return strict(version["schema"]["openAPIV3Schema"])


def check_kuberay(resource: dict) -> None:
    assert resource["apiVersion"] == "ray.io/v1"
    jsonschema.validate(resource, crd_schema(resource["kind"].lower() + "s"))


def orchestrator_commands(text: str) -> list[list[str]]:
    """The `orchestrator ...` commands in a shell line, as argument lists."""
    return [shlex.split(c)[1:] for c in re.findall(r"orchestrator [^;&|]+", text)]


def check_command(args: list[str]) -> None:
    parsed = build_parser().parse_args(args)
    for name in ("file",):
        if getattr(parsed, name, None):
            assert (ROOT / getattr(parsed, name)).is_file(), args


@pytest.mark.parametrize("name", ["kuberay-rayjob.yaml", "kuberay-cluster.yaml", "nightly-cronjob.yaml"])
def test_every_manifest_validates_against_its_schema(name):
    for resource in documents(name):
        if resource["apiVersion"].startswith("ray.io/"):
            check_kuberay(resource)
        else:
            kubernetes_validate.validate(resource, KUBERNETES, strict=True)


def test_the_validation_is_strict_enough_to_catch_a_misspelt_field():
    job = documents("kuberay-rayjob.yaml")[0]
    job["spec"]["shutdownAfterJobFinish"] = job["spec"].pop("shutdownAfterJobFinishes")
    with pytest.raises(jsonschema.ValidationError, match="shutdownAfterJobFinish"):
        check_kuberay(job)
    cron = documents("nightly-cronjob.yaml")[0]
    cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["workdir"] = "/"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(cron, KUBERNETES, strict=True)


def test_the_commands_deploy_runs_are_ours_and_name_files_that_exist():
    job, _ = documents("kuberay-rayjob.yaml")
    commands = orchestrator_commands(job["spec"]["entrypoint"])
    assert [c[0] for c in commands] == ["resume", "launch"]
    (cron,) = documents("nightly-cronjob.yaml")
    container = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    shell = container["command"][-1]
    # A driver runs on a Ray node: the nightly's pod joins the cluster first, with nothing for trials.
    assert container["command"][:2] == ["bash", "-c"] and shell.startswith(
        "ray start --address=sysgen-search-head-svc:6379 --num-cpus=0 --num-gpus=0 && "
    )
    commands += orchestrator_commands(shell)
    service = (DEPLOY / "systemd" / "sysgen-nightly.service").read_text()
    commands += orchestrator_commands(re.search(r"^ExecStart=(.*)$", service, re.M).group(1))
    for args in commands:
        check_command(args)
    # Both clusters' drivers and nodes see one volume at the repository's runs/ (launch folders and
    # trial storage).
    assert "/opt/sysgen-search/runs" in (DEPLOY / "kuberay-cluster.yaml").read_text()


def test_the_systemd_units_verify(tmp_path):
    """`systemd-analyze verify` warns (exit 0) about an unknown key: no output at all is the pass.
    The install paths are this checkout's, so that it can check the executable too."""
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze not found: apt-get install systemd")
    env_file = tmp_path / "nightly.env"
    env_file.write_text("RAY_AUTH_TOKEN=x\n")
    for unit in (DEPLOY / "systemd").iterdir():
        text = unit.read_text().replace("/opt/sysgen-search/.venv/bin", str(Path(sys.executable).parent))
        text = text.replace("/opt/sysgen-search", str(ROOT)).replace("/etc/sysgen/nightly.env", str(env_file))
        (tmp_path / unit.name).write_text(text)
    units = sorted(str(p) for p in tmp_path.glob("sysgen-nightly.*"))
    out = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True, text=True)
    assert out.returncode == 0 and not out.stdout + out.stderr, out.stdout + out.stderr


def test_the_image_leaves_out_what_git_leaves_out():
    """deploy/Dockerfile copies the checkout; Docker reads .dockerignore, not .gitignore: without it
    a local .venv (gigabytes of torch), launch folders and MLflow databases went into the image."""

    def patterns(name: str) -> set[str]:
        lines = (ROOT / name).read_text().splitlines()
        return {
            line.strip().lstrip("/").removeprefix("**/")
            for line in lines
            if line.strip() and not line.startswith("#")
        }

    assert patterns(".gitignore") <= patterns(".dockerignore")
    assert ".git" not in patterns(".dockerignore")  # the code version comes from it
