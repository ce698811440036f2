"""Operations without a cluster: certificates, the access table, the configuration file and
its environment overrides, and the deployment files (each parses and names what it must;
the commands they run are accepted by mosafs' own parser; the dashboard queries only
series mosafs exports)."""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from mosafs import certs, cli, metrics
from mosafs._proto import benefactor_pb2, manager_pb2, replication_pb2
from mosafs.config import apply, load_file
from mosafs.errors import AlreadyExists, ConfigError, NotFound
from mosafs.rpc.access import ACCESS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


# --- certificates ----------------------------------------------------------------------------

def test_unit_certificates_state_their_role(tmp_path: Path) -> None:
    certs.init_ca(tmp_path)
    with pytest.raises(AlreadyExists):
        certs.init_ca(tmp_path)
    certs.issue(tmp_path, "node7", "benefactor", hosts=("10.0.0.7", "node7.example"))
    identity = certs.load(tmp_path, "node7")
    assert (identity.role, identity.name) == ("benefactor", "node7")
    assert (tmp_path / "node7.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "ca.key").stat().st_mode & 0o777 == 0o600
    with pytest.raises(AlreadyExists):
        certs.issue(tmp_path, "node7", "benefactor")
    certs.issue(tmp_path, "node7", "client", overwrite=True)
    assert certs.load(tmp_path, "node7").role == "client"
    with pytest.raises(ConfigError, match="unknown role"):
        certs.issue(tmp_path, "x", "root")
    with pytest.raises(ConfigError, match="bad certificate name"):
        certs.issue(tmp_path, "../x", "client")
    with pytest.raises(NotFound, match="missing"):
        certs.load(tmp_path, "nobody")
    with pytest.raises(NotFound, match="mosafs certs init"):
        certs.issue(tmp_path / "empty", "x", "client")
    with pytest.raises(ConfigError, match="no mosafs role"):
        certs.role_of((tmp_path / "ca.crt").read_bytes())


def test_unit_every_rpc_has_an_access_rule() -> None:
    for service, table in ACCESS.items():
        module = {"Manager": manager_pb2, "Benefactor": benefactor_pb2,
                  "ManagerReplication": replication_pb2}[service.rsplit(".", 1)[1]]
        methods = {m.name for m in module.DESCRIPTOR.services_by_name[
            service.rsplit(".", 1)[1]].methods}
        assert methods == set(table), service
        for roles in table.values():
            assert roles and roles <= set(certs.ROLES)
    admin_only = {m for m, roles in ACCESS["mosafs.v1.Manager"].items() if roles == {"admin"}}
    assert {"CreatePool", "SetFolderSettings", "DrainBenefactor", "CollectGarbage", "Scrub",
            "Fsck", "Prune", "RemoveBenefactor"} <= admin_only


# --- configuration ---------------------------------------------------------------------------

def parser_of(command: str):  # type: ignore[no-untyped-def]
    cli.build_parser()
    return cli.COMMAND_PARSERS[command]


def test_unit_config_file_environment_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "mosafs.toml"
    path.write_text('[manager]\ngc-grace = 30\nlog_format = "json"\ninsecure = true\n'
                    'replication = 3\n')
    parser = parser_of("manager")
    chosen = apply(parser, "manager", path, environ={"MOSAFS_MANAGER_GC_GRACE": "45",
                                                     "MOSAFS_MANAGER_LOG_LEVEL": "debug"})
    assert chosen == {"gc_grace": 45.0, "log_format": "json", "insecure": True,
                      "replication": 3, "log_level": "DEBUG"}
    args = parser.parse_args(["--data-dir", "/x", "--replication", "2"])  # a flag wins
    assert (args.gc_grace, args.replication, args.insecure) == (45.0, 2, True)


@pytest.mark.parametrize("text, environ, message", [
    ("[manager]\ngc_graec = 3\n", {}, "[manager] gc_graec: unknown key"),
    ("[manager]\ngc-grace = -1\n", {}, "[manager] gc-grace: must be a positive number"),
    ("[manager]\nlog-format = \"xml\"\n", {}, "log-format: must be one of text, json"),
    ("[manager]\ninsecure = \"maybe\"\n", {}, "insecure: not a boolean"),
    ("[managr]\n", {}, "unknown section [managr]"),
    ("[manager\n", {}, "is not valid TOML"),
    ("", {"MOSAFS_MANAGER_GC_GRACE": "soon"}, "MOSAFS_MANAGER_GC_GRACE: not a number"),
    ("", {"MOSAFS_MANAGER_COLOUR": "blue"}, "MOSAFS_MANAGER_COLOUR: no option --colour"),
])
def test_unit_config_errors_name_the_key(tmp_path: Path, text: str, environ: dict[str, str],
                                         message: str) -> None:
    path = tmp_path / "mosafs.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        apply(parser_of("manager"), "manager", path, environ=environ)
    assert message in caught.value.message
    assert "\n" not in caught.value.message


# --- deployment files ------------------------------------------------------------------------

def accepted(argv: list[str]) -> None:
    """mosafs' own parser takes ARGV (so a deployment names no flag that does not exist);
    `--config FILE` stands for the example configuration."""
    parser = cli.build_parser()
    if argv[:1] == ["--config"]:
        command = argv[2]
        apply(cli.COMMAND_PARSERS[command], command, DEPLOY / "mosafs.toml.example", environ={})
    args = parser.parse_args(argv)
    assert args.command in cli.COMMANDS


def test_unit_example_configuration_is_valid() -> None:
    example = DEPLOY / "mosafs.toml.example"
    sections = load_file(example)
    assert set(sections) == {"manager", "benefactor", "mount"}
    for section in sections:
        assert apply(parser_of(section), section, example, environ={})
    k8s = yaml.safe_load_all((DEPLOY / "kubernetes" / "config.yaml").read_text())
    config = next(d for d in k8s if d["kind"] == "ConfigMap")
    embedded = DEPLOY / "embedded.toml"
    try:
        embedded.write_text(config["data"]["mosafs.toml"])
        for section in load_file(embedded):
            apply(parser_of(section), section, embedded, environ={})
    finally:
        embedded.unlink()


def test_unit_compose_and_dockerfile() -> None:
    compose = yaml.safe_load((DEPLOY / "compose" / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"manager", "benefactor-1", "benefactor-2", "benefactor-3", "client",
            "certs"} <= set(services)
    for name in ("manager", "benefactor-1", "benefactor-2", "benefactor-3", "client"):
        command = [str(a) for a in services[name]["command"]]
        accepted(command)
        assert "--tls-dir" in command and "--metrics-listen" in command
    client = services["client"]
    assert "/dev/fuse:/dev/fuse" in client["devices"] and "SYS_ADMIN" in client["cap_add"]
    assert any(v.get("bind", {}).get("propagation") == "rshared"
               for v in client["volumes"] if isinstance(v, dict))
    # Each process's volume of credentials is its own; the CA key is only the certs job's.
    tls_volumes = {name: [str(v).split(":")[0] for v in service.get("volumes", [])
                          if str(v).startswith(("tls", "ca:"))]
                   for name, service in services.items()}
    for name in ("manager", "benefactor-1", "benefactor-2", "benefactor-3", "client", "admin"):
        assert tls_volumes[name] == [f"tls-{name}"], name
    assert "ca" in tls_volumes["certs"]
    dockerfile = DockerfileParser(path=str(DEPLOY / "compose" / "Dockerfile"))
    assert dockerfile.baseimage.startswith("python:3.11")
    instructions = {i["instruction"] for i in dockerfile.structure}
    assert {"FROM", "RUN", "COPY", "ENTRYPOINT"} <= instructions
    assert json.loads(next(i["value"] for i in dockerfile.structure
                           if i["instruction"] == "ENTRYPOINT")) == ["mosafs"]
    assert "fuse3" in dockerfile.content


def test_unit_kubernetes_manifests() -> None:
    docs = [d for path in sorted((DEPLOY / "kubernetes").glob("*.yaml"))
            for d in yaml.safe_load_all(path.read_text()) if d]
    by_kind: dict[str, list[dict]] = {}  # type: ignore[type-arg]
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(doc)
        by_kind.setdefault(doc["kind"], []).append(doc)
    sets = {d["metadata"]["name"]: d for d in by_kind["StatefulSet"]}
    assert set(sets) == {"mosafs-manager", "mosafs-benefactor"}
    # Every pod mounts the CA certificate and its own certificate and key, nothing else.
    for workload, name in ((sets["mosafs-manager"], "manager"),
                           (sets["mosafs-benefactor"], "benefactor"),
                           (by_kind["DaemonSet"][0], "client")):
        (tls,) = [v["secret"] for v in workload["spec"]["template"]["spec"]["volumes"]
                  if "secret" in v]
        assert sorted(i["key"] for i in tls["items"]) == sorted(
            ["ca.crt", f"{name}.crt", f"{name}.key"]), name
    for stateful in sets.values():
        assert stateful["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
        container = stateful["spec"]["template"]["spec"]["containers"][0]
        accepted([a.replace("$(POD_NAME)", "pod-0") for a in container["args"]])
    (daemon,) = by_kind["DaemonSet"]
    pod = daemon["spec"]["template"]["spec"]
    container = pod["containers"][0]
    accepted(container["args"])
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert any(v.get("hostPath", {}).get("path") == "/dev/fuse" for v in pod["volumes"])
    assert any(m.get("mountPropagation") == "Bidirectional" for m in container["volumeMounts"])
    assert {"Namespace", "ConfigMap", "Service"} <= set(by_kind)


def test_unit_systemd_units() -> None:
    for path in sorted((DEPLOY / "systemd").glob("*.service")):
        unit = configparser.ConfigParser(strict=False, interpolation=None)
        unit.optionxform = str  # type: ignore[assignment,method-assign]
        unit.read(path)
        assert {"Unit", "Service", "Install"} <= set(unit.sections()), path.name
        command = shlex.split(unit["Service"]["ExecStart"].replace("%i", "disk1"))
        assert command[0].endswith("/mosafs") and command[1:3] == ["--config",
                                                                  "/etc/mosafs/mosafs.toml"]
        accepted(command[1:])


def test_unit_dashboard_queries_mosafs_series() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "mosafs-dashboard.json").read_text())
    exported = set(re.findall(r"mosafs_[a-z_]+", metrics.__doc__ or ""))
    queried = set()
    for panel in dashboard["panels"]:
        assert panel["title"] and panel["targets"]
        for target in panel["targets"]:
            queried.update(re.findall(r"mosafs_[a-z_]+", target["expr"]))
    base = {re.sub(r"_(total|bucket|count|sum)$", "", name) for name in queried}
    assert base <= {re.sub(r"_total$", "", name) for name in exported}, base - exported
    assert {"mosafs_manager_under_replicated_chunks", "mosafs_client_sent_bytes",
            "mosafs_rpc_server_seconds"} <= base
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    assert len(prometheus["scrape_configs"]) == 3


def test_unit_compose_certs_job_gives_each_process_its_own_credentials(tmp_path: Path) -> None:
    """The `certs` service's script, run here with mosafs' own CLI (paths moved under
    TMP_PATH): each process's volume gets the CA certificate and its own certificate and
    key, of the right role, and nothing else; a second run changes nothing."""
    compose = yaml.safe_load((DEPLOY / "compose" / "docker-compose.yml").read_text())
    script = compose["services"]["certs"]["command"][0].replace("$$", "$")
    script = re.sub(r"(?<=\s)/(ca|out)(?=[/;\s])", lambda m: f"{tmp_path}/{m[1]}", script)
    names = {"manager": "manager", "benefactor-1": "benefactor", "benefactor-2": "benefactor",
             "benefactor-3": "benefactor", "client": "client", "admin": "admin"}
    for name in names:
        (tmp_path / "out" / name).mkdir(parents=True)
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    for _ in range(2):
        done = subprocess.run(["sh", "-ec", script], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
    for name, role in names.items():
        out = tmp_path / "out" / name
        assert sorted(p.name for p in out.iterdir()) == sorted(
            ["ca.crt", f"{name}.crt", f"{name}.key"])
        identity = certs.load(out, name)
        assert (identity.role, identity.name) == (role, name)
        assert identity.ca == (tmp_path / "ca" / "ca.crt").read_bytes()
