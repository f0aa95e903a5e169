"""How sbatch reads the #SBATCH lines of a batch script, so that an extra line is judged by what sbatch will
make of it, not by how it looks.

    read_sbatch_lines(["--constraint=a100 -o /tmp/x"])
    # [SbatchOption("constraint", "--constraint=a100", 0), SbatchOption("output", "-o", 0)]

sbatch (Slurm 22.05's src/sbatch/opt.c) joins the words of every #SBATCH line into one argument list and
hands it to glibc's getopt_long with its option table (src/common/slurm_opt.c) and "+" (options end at the
first word that is not one). So:

- a line is split into words at blanks; ' and " group, a backslash takes the next character as it is, an
  unquoted # ends the line, an empty word ends the line too, and "hetjob"/"packjob" starts another component;
- a long option may be cut to any prefix that names one option only (``--out`` is ``--output``), takes its
  value after = or as the next word, and an optional value only after =;
- short options combine (``-Ho/x`` is ``--hold --output=/x``) and take a value from the rest of the word or
  the next word (``-oFILE``, ``-o FILE``); ``-output`` is ``-o utput``;
- a word that is not an option stops sbatch's reading, and sbatch then refuses the script.

Any of these that cannot be read as sbatch would raises ``SbatchLineError`` naming the line and the word.
Torch-free and small: the config's validation (contract/slurm_options.py) calls it on every change.
"""

from __future__ import annotations

from typing import NamedTuple

NO, REQUIRED, OPTIONAL = "no", "required", "optional"  # getopt's has_arg

# Slurm 22.05's sbatch options, in the order of its table (glibc takes the first of equal prefixes), with
# their short letter. Aliases name the option they set (--tasks-per-node is --ntasks-per-node).
_TABLE = """account R A; acctg-freq R; array R a; batch R; begin R b; bb R; bbf R; cluster-constraint R; chdir R D;
cluster R =clusters; clusters R M; comment R; container R; context R; contiguous N; constraint R C; core-spec R S;
cores-per-socket R; cpu-freq R; cpus-per-gpu R; cpus-per-task R c; deadline R; delay-boot R; dependency R d;
distribution R m; error R e; exclude R x; exclusive O; export R; export-file R; extra-node-info R B; get-user-env O;
gid R; gpu-bind R; gpu-freq R; gpus R G; gpus-per-node R; gpus-per-socket R; gpus-per-task R; gres R; gres-flags R;
help N h; hint R; hold N H; ignore-pbs N; input R i; job-name R J; kill-on-invalid-dep R; licenses R L;
mail-type R; mail-user R; mcs-label R; mem R; mem-bind R; mem-per-cpu R; mem-per-gpu R; mincpus R; network R;
nice O; no-kill O k; no-requeue N; nodefile R F; nodelist R w; nodes R N; ntasks R n; ntasks-per-core R;
ntasks-per-gpu R; ntasks-per-node R; ntasks-per-socket R; ntasks-per-tres R; open-mode R; output R o;
overcommit N O; oversubscribe N s; parsable N; partition R p; power R; prefer R; priority R; profile R;
propagate O; qos R q; quiet N Q; reboot N; requeue N; reservation R; signal R; sockets-per-node R; spread-job N;
switches R; tasks-per-node R =ntasks-per-node; test-only N; thread-spec R; threads-per-core R; time R t;
time-min R; tmp R; uid R; use-min-nodes N; verbose N v; version N V; usage N; wait N W; wait-all-nodes R;
wckey R; wrap R"""
_ARG = {"N": NO, "R": REQUIRED, "O": OPTIONAL}


class _Option(NamedTuple):
    name: str  # as the table spells it
    has_arg: str
    sets: str  # the option it sets: its own name, or for an alias the option it stands for


def _read_table() -> tuple[tuple[_Option, ...], dict[str, _Option]]:
    options, short = [], {}
    for entry in _TABLE.replace("\n", " ").split(";"):
        name, arg, *rest = entry.split()
        alias = next((word[1:] for word in rest if word.startswith("=")), None)
        option = _Option(name, _ARG[arg], alias or name)
        options.append(option)
        for letter in (word for word in rest if not word.startswith("=")):
            short[letter] = option
    return tuple(options), short


LONG_OPTIONS, SHORT_OPTIONS = _read_table()
NAMES = frozenset(option.name for option in LONG_OPTIONS)


class SbatchOption(NamedTuple):
    sets: str  # the long option sbatch sets (an alias's own option): "output"
    written: str  # how the line wrote it: "-o", "--out", "--output=x"
    line: int  # which of the lines it is on


class SbatchLineError(ValueError):
    """A line sbatch would refuse, or read otherwise than it looks; ``line`` is its index."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


def sbatch_word(value: str) -> str:
    """``value`` written so that sbatch reads it back as one word: as it is where nothing in it is special to
    sbatch, else in double quotes with its " and \\ escaped (a folder named "my runs #2" stays one path)."""
    if value and not any(char.isspace() or char in "\"'\\#" for char in value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _words(text: str, line: int) -> list[str]:
    """The words sbatch's get_argument takes from one #SBATCH line (after "#SBATCH")."""
    words, pos, end = [], 0, len(text)
    while True:
        while pos < end and text[pos].isspace():
            pos += 1
        for separator in ("hetjob", "packjob"):
            after = pos + len(separator)
            if text[pos:after].lower() == separator and (after == end or text[after].isspace()):
                raise SbatchLineError(line, f"{separator!r} starts another component of a heterogeneous job; "
                                      "a Parallax run is one job")
        if pos == end or text[pos] == "#":
            return words
        if text[pos] == ":":
            raise SbatchLineError(line, "a word starting with ':' separates components of a heterogeneous job, "
                                  "which sbatch refuses in a script")
        word, quote, escaped = [], "", False
        while pos < end and (quote or not text[pos].isspace()):
            char = text[pos]
            pos += 1
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
                continue
            elif quote:
                if char == quote:
                    quote = ""
                    continue
            elif char in "\"'":
                quote = char
                continue
            elif char == "#":  # a comment: the rest of the line is not read
                pos = end
                break
            word.append(char)
        if quote:
            raise SbatchLineError(line, f"its {quote} is never closed (sbatch refuses the script)")
        if not word:  # sbatch takes an empty word ("") as the end of the line: what follows is not read
            if text[pos:].strip():
                raise SbatchLineError(line, "an empty value (\"\" or '') ends sbatch's reading of the line, and "
                                      "what follows it would be lost; leave the empty value out")
            return words
        words.append("".join(word))


def _long_option(word: str, line: int) -> _Option | None:
    """The option ``--name`` stands for as getopt_long finds it: the exact name, else the one option the
    name is a prefix of (or several that are one option); None where no option starts so."""
    name = word[2:].split("=", 1)[0]
    if name in NAMES:
        return next(option for option in LONG_OPTIONS if option.name == name)
    matches = [option for option in LONG_OPTIONS if option.name.startswith(name)]
    if not matches:
        return None
    if len(matches) == 1:  # (getopt also takes several entries of one option; no prefix matches two such here)
        return matches[0]
    shown = ", ".join(f"--{m.name}" for m in matches[:8]) + (f" and {len(matches) - 8} more" if len(matches) > 8 else "")
    raise SbatchLineError(line, f"sbatch reads --{name} as any of {shown} and refuses it; write the option in full")


def read_sbatch_lines(lines: list[str] | tuple[str, ...]) -> list[SbatchOption]:
    """Every option ``lines`` set, read as sbatch reads #SBATCH lines; SbatchLineError where sbatch would
    refuse a word or read a value from another line."""
    words = [(word, index) for index, text in enumerate(lines) for word in _words(text, index)]
    found: list[SbatchOption] = []
    position = 0

    def value_after(option: _Option, written: str, line: int) -> None:
        nonlocal position
        if position >= len(words) or words[position][1] != line:
            raise SbatchLineError(line, f"{written} takes a value: give it on the same line, e.g. --{option.name}=VALUE")
        position += 1

    while position < len(words):
        word, line = words[position]
        position += 1
        if word == "--":
            if position < len(words):
                raise SbatchLineError(line, f"sbatch reads no option after '--' ({words[position][0]!r} would "
                                      "be refused)")
            break
        if not word.startswith("-") or word == "-":
            raise SbatchLineError(line, f"{word!r} is not an sbatch option: sbatch stops reading options there "
                                  "and refuses the script; quote a value that holds blanks, e.g. "
                                  "--comment=\"two words\"")
        if word.startswith("--"):
            option = _long_option(word, line)
            if option is None:  # unknown to Slurm 22.05: a newer sbatch's option, taken as written
                if "=" not in word and position < len(words) and words[position][1] == line \
                        and not words[position][0].startswith("-"):
                    raise SbatchLineError(line, f"{word} is not an option of Slurm 22.05: give its value after =, "
                                          f"e.g. {word}=VALUE, so that the line reads the same to any sbatch")
                continue
            if option.has_arg == NO and "=" in word:
                written = word.split("=", 1)[0]
                named = written if written == f"--{option.name}" else f"{written} (--{option.name})"
                raise SbatchLineError(line, f"{named} takes no value")
            if option.has_arg == REQUIRED and "=" not in word:
                value_after(option, word, line)
            found.append(SbatchOption(option.sets, word, line))
            continue
        for at, letter in enumerate(word[1:], start=1):
            option = SHORT_OPTIONS.get(letter)
            if option is None:
                raise SbatchLineError(line, f"-{letter} (in {word!r}) is not an sbatch option")
            found.append(SbatchOption(option.sets, f"-{letter}", line))
            if option.has_arg == NO:
                continue
            if option.has_arg == REQUIRED and at == len(word) - 1:
                value_after(option, f"-{letter}", line)
            break  # the rest of the word, if any, is the option's value
    return found
