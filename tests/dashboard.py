"""
The dashboard's pages in headless Chromium (tests/cdp.py): signing in,
opening a view, and screenshots of a view at desktop and phone widths,
left in tests/.cache/dashboard/.
"""

import json

from tests.gateway import REPO

SHOTS = REPO / "tests" / ".cache" / "dashboard"
DESKTOP = (1280, 860, False)
PHONE = (390, 844, True)


def sign_in(page, url, user, password):
    page.go(url)
    page.wait_for("!!document.querySelector('#signin')")
    page.evaluate(
        f"""document.querySelector('#signin-user').value = {json.dumps(user)};
        document.querySelector('#signin-password').value = {json.dumps(password)};
        document.querySelector('#signin').requestSubmit()"""
    )
    page.wait_for("document.querySelector('#connection').dataset.state === 'up'")


def show(page, view):
    page.evaluate(f"location.hash = '#{view}'")
    page.wait_for(f"document.title.startsWith({json.dumps(view.capitalize())})")


def screenshots(page, view, ready):
    """The view at desktop and phone widths; at phone width nothing runs off the side."""
    for name, (width, height, mobile) in (("desktop", DESKTOP), ("phone", PHONE)):
        page.viewport(width, height, mobile)
        page.wait_for(f"innerWidth === {width}")
        page.wait_for(ready)
        shot = page.screenshot(SHOTS / f"{view}-{name}.png")
        assert shot.stat().st_size > 10_000
        assert page.evaluate("document.documentElement.scrollWidth <= innerWidth"), (view, name)
    page.viewport(*DESKTOP)
