"""A file's language from its name, extension or shebang line (the names chunking and the
``--lang`` filter use).

>>> detect_language("src/app.tsx"), detect_language("Dockerfile")
('tsx', 'dockerfile')
"""

from __future__ import annotations

import re

__all__ = ["CPP_HINTS", "LANGUAGES", "canonical_language", "detect_language"]



# Tokens that appear in C++ headers and never in C ones (".h" is used for both).
CPP_HINTS = re.compile(
    rb"^\s*(?:namespace\s+\w+|template\s*<|class\s+\w+[^;]*\{|(?:public|private|protected):)"
    rb"|\bstd::", re.M,
)


_EXTENSIONS = {
    ".py": "python", ".pyi": "python", ".pyw": "python", ".pyx": "cython",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".mts": "typescript", ".cts": "typescript", ".tsx": "tsx",
    ".go": "go", ".rs": "rust", ".java": "java", ".kt": "kotlin", ".kts": "kotlin",
    ".scala": "scala", ".sc": "scala", ".swift": "swift",
    ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".c++": "cpp",
    ".hh": "cpp", ".hpp": "cpp", ".hxx": "cpp", ".h++": "cpp", ".ipp": "cpp", ".inl": "cpp",
    ".cs": "csharp", ".php": "php", ".phtml": "php",
    ".rb": "ruby", ".rake": "ruby", ".gemspec": "ruby", ".ru": "ruby",
    ".ex": "elixir", ".exs": "elixir", ".hs": "haskell", ".lua": "lua", ".zig": "zig",
    ".sh": "bash", ".bash": "bash", ".zsh": "bash", ".ksh": "bash", ".bats": "bash",
    ".md": "markdown", ".markdown": "markdown", ".mdx": "markdown",
    ".rst": "restructuredtext", ".txt": "text", ".adoc": "asciidoc",
    ".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json", ".jsonc": "json",
    ".json5": "json", ".ini": "ini", ".cfg": "ini", ".conf": "ini", ".sql": "sql",
    ".html": "html", ".htm": "html", ".xml": "xml", ".svg": "xml", ".css": "css",
    ".scss": "scss", ".less": "less", ".vue": "vue", ".svelte": "svelte",
    ".proto": "protobuf", ".graphql": "graphql", ".gql": "graphql", ".tf": "hcl",
    ".hcl": "hcl", ".dart": "dart", ".r": "r", ".jl": "julia", ".pl": "perl", ".pm": "perl",
    ".m": "objc", ".mm": "objc", ".ml": "ocaml", ".mli": "ocaml", ".erl": "erlang",
    ".clj": "clojure", ".groovy": "groovy", ".gradle": "groovy", ".ps1": "powershell",
    ".bat": "batch", ".cmd": "batch", ".cmake": "cmake", ".mk": "makefile",
    ".dockerfile": "dockerfile", ".nix": "nix", ".bzl": "starlark", ".star": "starlark",
    ".tex": "latex", ".csv": "csv", ".tsv": "csv", ".ipynb": "json",
}


_FILENAMES = {
    "Makefile": "makefile", "makefile": "makefile", "GNUmakefile": "makefile",
    "Dockerfile": "dockerfile", "Containerfile": "dockerfile", "Rakefile": "ruby",
    "Gemfile": "ruby", "Vagrantfile": "ruby", "Podfile": "ruby", "Brewfile": "ruby",
    "Jenkinsfile": "groovy", "CMakeLists.txt": "cmake", "BUILD": "starlark",
    "BUILD.bazel": "starlark", "WORKSPACE": "starlark", "Tiltfile": "starlark",
    ".bashrc": "bash", ".bash_profile": "bash", ".profile": "bash", ".zshrc": "bash",
    "Justfile": "makefile", "justfile": "makefile", "Procfile": "text",
    "LICENSE": "text", "README": "text", "CODEOWNERS": "text",
}


_INTERPRETERS = {
    "python": "python", "pypy": "python", "node": "javascript", "nodejs": "javascript",
    "deno": "typescript", "bun": "javascript", "ts-node": "typescript", "tsx": "typescript",
    "ruby": "ruby", "bash": "bash", "sh": "bash", "zsh": "bash", "dash": "bash", "ksh": "bash",
    "perl": "perl", "php": "php", "lua": "lua", "luajit": "lua", "elixir": "elixir",
    "runhaskell": "haskell", "runghc": "haskell", "stack": "haskell", "scala": "scala",
    "swift": "swift", "kotlin": "kotlin", "rscript": "r", "julia": "julia",
}


_SHEBANG = re.compile(r"^#!\s*(\S+)(?:\s+(.*))?")


#: Every name `detect_language` can give a file: what ``--lang`` accepts.
LANGUAGES = frozenset({*_EXTENSIONS.values(), *_FILENAMES.values(), *_INTERPRETERS.values(), "text"})

# What people type for a language besides its name: its file extension ("py", "rs", "js")
# is taken as an alias too.
_ALIASES = {
    "golang": "go", "shell": "bash", "sh": "bash", "c#": "csharp", "cs": "csharp",
    "objective-c": "objc", "objectivec": "objc", "jsx": "javascript", "node": "javascript",
    "docker": "dockerfile", "make": "makefile", "rst": "restructuredtext", "hs": "haskell",
}


def canonical_language(name: str) -> str | None:
    """The language ``--lang NAME`` means (``"Python"``, ``"py"`` -> ``"python"``), or None.

    >>> canonical_language("Py"), canonical_language("golang"), canonical_language("klingon")
    ('python', 'go', None)
    """
    key = name.strip().lower()
    if key in LANGUAGES:
        return key
    return _ALIASES.get(key) or _EXTENSIONS.get("." + key.lstrip("."))


def detect_language(path: str, first_line: str = "") -> str:
    """Name the language of a file from its extension, its name, or its shebang line.

    Parameters
    ----------
    path : str
        The file's path (only the name is looked at).
    first_line : str
        The file's first line, for extension-less scripts (``#!/usr/bin/env python3``).

    Returns
    -------
    str
        A lower-case language name (``"python"``, ``"tsx"``, ``"yaml"``, ...), ``"text"``
        when nothing is known.

    Examples
    --------
    >>> detect_language("src/app.tsx"), detect_language("Dockerfile")
    ('tsx', 'dockerfile')
    >>> detect_language("bin/tool", "#!/usr/bin/env python3")
    'python'
    """
    # (PurePosixPath(path).name and .suffix, without two Path objects a file: a walk of a
    # 114k-file repository spent a fifth of its time making them)
    name = path.rstrip("/").rpartition("/")[2]
    if name in _FILENAMES:
        return _FILENAMES[name]
    dot = name.rfind(".")
    suffix = name[dot:].lower() if 0 < dot < len(name) - 1 else ""
    if suffix in _EXTENSIONS:
        return _EXTENSIONS[suffix]
    if name.startswith("Dockerfile.") or name.endswith(".Dockerfile"):
        return "dockerfile"
    if first_line.startswith("#!"):
        return _language_from_shebang(first_line)
    return "text"


def _language_from_shebang(line: str) -> str:
    m = _SHEBANG.match(line.strip())
    if not m:
        return "text"
    program = m.group(1).rsplit("/", 1)[-1]
    if program == "env" and m.group(2):
        # `#!/usr/bin/env -S node --flag` names the interpreter after env's own options.
        args = [a for a in m.group(2).split() if not a.startswith("-") and "=" not in a]
        program = args[0] if args else ""
    # python3.11 -> python, ruby2.7 -> ruby
    program = re.sub(r"[\d.]+$", "", program.lower())
    return _INTERPRETERS.get(program, "text")
