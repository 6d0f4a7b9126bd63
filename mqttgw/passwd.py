"""
Create and update password files, as ``mosquitto_passwd`` does and in its
format, so mqttgw and mosquitto can share one file::

    python -m mqttgw.passwd -c passwordfile alice          # new file; asks twice
    python -m mqttgw.passwd -b passwordfile bob PASSWORD   # add or change, batch
    python -m mqttgw.passwd -D passwordfile bob            # delete
    python -m mqttgw.passwd -U passwordfile                # hash a plain text file

Entries are written in the ``$7$`` (PBKDF2-SHA512) form.
"""

import argparse
import getpass
import os
import sys
import tempfile

from mqttgw.security.files import AuthConfigError
from mqttgw.security.passwords import hash_password, parse_entry


class PasswdError(Exception):
    """What went wrong, in one line."""


def _read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        raise PasswdError(f"{path}: no such file (use -c to create it)") from None
    except OSError as e:
        raise PasswdError(f"{path}: cannot read: {e.strerror}") from None


def _write(path, lines):
    """Replace the file at once, readable by its owner only when new."""
    directory = os.path.dirname(os.path.abspath(path))
    mode = os.stat(path).st_mode & 0o777 if os.path.exists(path) else 0o600
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".passwd-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as e:
        os.unlink(tmp)
        raise PasswdError(f"{path}: cannot write: {e.strerror}") from None


def _check_username(username):
    # The gateway reads a line's user name without the spaces around it.
    if (
        not username
        or ":" in username
        or any(ord(c) < 0x20 for c in username)
        or username != username.strip()
    ):
        raise PasswdError(
            f"invalid user name {username!r}: no ':', control characters, or spaces at either end"
        )


def _user(line):
    """A line's user name, as the gateway reads it."""
    return line.strip().partition(":")[0]


def set_password(lines, username, password):
    entry = f"{username}:{hash_password(password)}"
    out, found = [], False
    for line in lines:
        if _user(line) == username:
            if not found:
                out.append(entry)
            found = True
        else:
            out.append(line)
    if not found:
        out.append(entry)
    return out


def delete(lines, username):
    out = [line for line in lines if _user(line) != username]
    if len(out) == len(lines):
        raise PasswdError(f"user {username!r} not found")
    return out


def hash_plain_text(lines, path):
    out = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            out.append(line)
            continue
        username, sep, password = line.partition(":")
        if not sep or not username:
            raise PasswdError(f"{path}:{number}: not a 'user:password' line")
        if parse_entry(password) is not None:
            raise PasswdError(f"{path}:{number}: already hashed (was -U run twice?)")
        out.append(f"{username}:{hash_password(password)}")
    return out


def _ask(username):
    first = getpass.getpass(f"Password for {username}: ")
    if first != getpass.getpass("Reenter password: "):
        raise PasswdError("passwords do not match")
    return first


def build_parser():
    """The command line, as main() reads it and the manual page shows it."""
    parser = argparse.ArgumentParser(
        prog="python -m mqttgw.passwd",
        description="Manage password files in mosquitto's format.",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("-c", action="store_true", help="create a new file, overwriting any")
    mode.add_argument("-D", action="store_true", help="delete the user")
    mode.add_argument("-U", action="store_true", help="hash the passwords of a plain text file")
    parser.add_argument("-b", action="store_true", help="batch: the password is the last argument")
    parser.add_argument("passwordfile", help="the password file")
    parser.add_argument("username", nargs="?", help="the user to add, change or delete")
    parser.add_argument("password", nargs="?", help="the password, with -b (else it is asked for)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        if args.U:
            if args.username or args.b:
                raise PasswdError("-U takes only the password file")
            _write(args.passwordfile, hash_plain_text(_read(args.passwordfile), args.passwordfile))
            return 0
        if args.username is None:
            raise PasswdError("a user name is needed")
        _check_username(args.username)
        if args.b != (args.password is not None) or (args.D and args.password is not None):
            raise PasswdError("give a password with -b, and only then")
        lines = [] if args.c else _read(args.passwordfile)
        if args.D:
            lines = delete(lines, args.username)
        else:
            password = args.password if args.b else _ask(args.username)
            lines = set_password(lines, args.username, password)
        _write(args.passwordfile, lines)
    except (PasswdError, AuthConfigError) as e:
        print(f"mqttgw.passwd: {e}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, EOFError):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
