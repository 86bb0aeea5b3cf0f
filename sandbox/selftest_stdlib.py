"""The hostile suite's standard-library case, as a ``HostileCase`` keyword spec that
``sandbox.selftest`` turns into a case: ``stdlib_complete`` imports, in an episode, modules the
clean parent never imports before its uid drop (``_strptime`` through the determinism shim's
``datetime.strptime``, ``html``, ``xml``, ``sqlite3``, ``zoneinfo``, ``email``: unreachable when
the interpreter lives under a 0700 directory, ``sandbox.importpaths``), and a bad date must
still be a ``ValueError``. Its outcome must be ``ok``.

May import: the standard library only.
"""

from __future__ import annotations

COLD_MODULES = ("_strptime", "html.parser", "xml.etree.ElementTree", "xml.dom.minidom", "sqlite3",
                "zoneinfo", "email.parser", "tomllib", "shlex", "gzip")
STDLIB_BODY = f"""
import importlib
import datetime
failed = {{}}
for name in {COLD_MODULES!r}:
    try:
        importlib.import_module(name)
    except ImportError as e:
        failed[name] = str(e)
try:
    datetime.datetime.strptime('31/12/2024', '%Y-%m-%d')
    failed['strptime'] = 'a bad date parsed'
except ValueError:
    pass
d = datetime.datetime.strptime('2024-02-29 13:05', '%Y-%m-%d %H:%M')
if failed or d != datetime.datetime(2024, 2, 29, 13, 5):
    raise ImportError(f'not importable in an episode: {{failed}} (strptime gave {{d}})')
return {{'success': True, 'strptime': d.isoformat()}}
"""
STDLIB_CASES = [
    dict(name="stdlib_complete", body=STDLIB_BODY, expect=("ok",),
         attack="import modules not pre-imported (_strptime, html, xml, sqlite3, ...)"),
]
