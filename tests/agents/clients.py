"""How tests/agents points each pinned agent CLI at a server, the documented
way and nothing more (README "Coding agents"): Claude Code through
ANTHROPIC_BASE_URL, Codex through a custom Responses provider in a temporary
CODEX_HOME, Qwen Code through the OpenAI variables. Telemetry and update
checks are off, and any address but loopback goes to a dead proxy port.
Used by agents_test.py (turns against k3-script-serve) and capture_tools.py
(the tool schemas the CLIs send)."""

from __future__ import annotations

import json
import os


def offline_env(bin_dir: str, home: str, **extra: str) -> dict:
    env = {
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "CI": "1",
        # Anything not on loopback goes to a closed port, never out.
        "HTTP_PROXY": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    env.update(extra)
    return env


def clients(bin_dir: str, base: str, work: str, home: str, prompt: str, model: str, key: str,
            codex_retries: bool = True) -> list[tuple[str, list[str], dict]]:
    """(name, argv, env) of `claude -p`, `codex exec` and `qwen -p` asking
    `prompt` of `model` at `base` (no /v1). Writes Codex's config under
    work/codex and Qwen Code's settings under home/.qwen."""
    codex_home = os.path.join(work, "codex")
    os.makedirs(codex_home, exist_ok=True)
    retries = "" if codex_retries else "request_max_retries = 0\nstream_max_retries = 0\n"
    with open(os.path.join(codex_home, "config.toml"), "w") as f:
        f.write(f'model = "{model}"\nmodel_provider = "k3"\ncheck_for_update_on_startup = false\n\n'
                f'[model_providers.k3]\nname = "k3"\nbase_url = "{base}/v1"\nwire_api = "responses"\n'
                f'env_key = "K3_API_KEY"\n{retries}\n[analytics]\nenabled = false\n\n[otel]\nexporter = "none"\n')
    os.makedirs(os.path.join(home, ".qwen"), exist_ok=True)
    with open(os.path.join(home, ".qwen", "settings.json"), "w") as f:
        json.dump({"telemetry": {"enabled": False}, "privacy": {"usageStatisticsEnabled": False},
                   "general": {"disableAutoUpdate": True, "disableUpdateNag": True}}, f)
    return [
        # Claude Code: only the base URL, a key and --model (no workaround).
        ("claude -p", ["claude", "-p", prompt, "--model", model],
         offline_env(bin_dir, home, ANTHROPIC_BASE_URL=base, ANTHROPIC_API_KEY=key, DISABLE_TELEMETRY="1",
                     DISABLE_ERROR_REPORTING="1", DISABLE_AUTOUPDATER="1",
                     CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")),
        ("codex exec", ["codex", "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", prompt],
         offline_env(bin_dir, home, CODEX_HOME=codex_home, K3_API_KEY=key)),
        ("qwen -p", ["qwen", "-p", prompt, "--auth-type", "openai"],
         offline_env(bin_dir, home, OPENAI_BASE_URL=base + "/v1", OPENAI_API_KEY=key, OPENAI_MODEL=model)),
    ]
