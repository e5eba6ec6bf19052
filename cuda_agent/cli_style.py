"""How every `cuda-agent` command shows its help: no type labels, a readable usage line.

Typer labels each option with its Python type (`<bool>`, `<str>`) and writes a required
argument as `{tasks}` in the usage line. The classes here show flags bare, a value option
with click's plain metavar (`--repeats INTEGER`), and arguments in capitals
(`Usage: cuda-agent bench [OPTIONS] TASKS`). `plain_help(app)` applies them to every
command of an app and its sub-apps.
"""

from __future__ import annotations

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
from typer.models import DefaultPlaceholder


_PLAIN_NAMES = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "path": "PATH", "file": "PATH", "directory": "PATH"}


class PlainArgument(TyperArgument):
    """An argument named in capitals, without a type label."""

    @property
    def display_name_raw(self) -> str:
        return self.metavar or (self.name or "").upper()

    def display_type_rich(self, ctx) -> None:
        return None

    def get_usage_pieces(self, ctx) -> list[str]:
        name = self.display_name_raw + ("..." if self.nargs != 1 else "")
        return [name if self.required else f"[{name}]"]


class PlainOption(TyperOption):
    """A flag without a label; an option with a value shows click's metavar (TEXT, INTEGER, PATH)."""

    def display_type_rich(self, ctx) -> str | None:
        if self.metavar is not None:
            return self.metavar
        if self.is_flag or self.count:
            return None
        label = self.display_type(ctx).strip("<>")
        many = label.startswith("list[")
        label = label.removeprefix("list[").removesuffix("]")
        label = _PLAIN_NAMES.get(label, label.upper())
        return f"{label}..." if many else label


def _plain(param):
    if type(param) is TyperArgument:
        param.__class__ = PlainArgument
    elif type(param) is TyperOption:
        param.__class__ = PlainOption
    return param


def unwrap_paragraphs(text: str) -> str:
    """Each paragraph of a docstring on one line, so the help wraps it to the terminal. Typer joins the
    lines of the first paragraph only and prints the others' line breaks as they are. A paragraph with an
    indented or bulleted line (an example, a list) keeps its lines."""
    paragraphs = []
    for paragraph in text.split("\n\n"):
        lines = paragraph.split("\n")
        if any(line[:1].isspace() or line.lstrip().startswith(("-", "*")) for line in lines):
            paragraphs.append(paragraph)
        else:
            paragraphs.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(paragraphs)


class PlainCommand(TyperCommand):
    """A command whose parameters are shown the plain way, its help text wrapped to the terminal."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.help:
            self.help = unwrap_paragraphs(self.help)

    def get_params(self, ctx) -> list:
        return [_plain(param) for param in super().get_params(ctx)]


class PlainGroup(TyperGroup):
    """A group (the root app, `workspace`, `keys`) whose own options are shown the plain way."""

    def get_params(self, ctx) -> list:
        return [_plain(param) for param in super().get_params(ctx)]


def _chosen(cls, default) -> bool:
    """Whether a class was chosen by the command itself (not typer's default)."""
    return not (cls is None or cls is default or isinstance(cls, DefaultPlaceholder))


def plain_help(app: typer.Typer) -> None:
    """Give every command of `app` (and of its sub-apps) the plain classes, unless it chose its own."""
    if not _chosen(app.info.cls, TyperGroup):
        app.info.cls = PlainGroup
    for command in app.registered_commands:
        if not _chosen(command.cls, TyperCommand):
            command.cls = PlainCommand
    for group in app.registered_groups:
        if not _chosen(group.cls, TyperGroup):
            group.cls = PlainGroup
        if group.typer_instance is not None:
            plain_help(group.typer_instance)
