"""Start-up check of the pinned stack.

dm-reverb 0.14 is built against TF 2.15; with any other TF it dies inside
`import reverb` with "could not find the required symbols". Reading package
metadata first (no imports) lets us say what is wrong in one line instead.
"""

from importlib import metadata

from core.errors import UserError

REQUIRED = {
    'tensorflow': '2.15.',
    'tf-agents': '0.19.',
    'dm-reverb': '0.14.',
    'tensorflow-probability': '0.23.',
}


def check_versions(required=REQUIRED):
    """Raises UserError naming every package whose version is off."""
    problems = []
    for package, prefix in required.items():
        try:
            version = metadata.version(package)
        except metadata.PackageNotFoundError:
            problems.append(f"{package} is not installed (need {prefix}x)")
            continue
        if not version.startswith(prefix):
            problems.append(f"{package} {version} is installed (need {prefix}x)")
    if problems:
        raise UserError(
            "Wrong package versions: " + '; '.join(problems) +
            ". Run `make install` to rebuild .venv from requirements.lock.")
