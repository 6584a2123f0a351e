"""A person using the Relay web console in headless Chromium: Playwright driving the system's
browser (it never downloads one). Run by tests/it/console.rs, which starts the server and plays
the agents: each `want STEP [ARG]` line this prints asks it for something, answered on stdin with
`ok VALUE` or `fail WHY`. The last line is `passed` when every check held.

    python browser.py --url http://127.0.0.1:PORT --chromium /usr/bin/chromium [--artifacts DIR]
    (the human token in RELAY_HUMAN_TOKEN)
"""

import argparse
import os
import re
import sys
import time

from playwright.sync_api import expect, sync_playwright

# A card that moves on the server moves on the page within this long.
LIVE_S = 1.0


def say(line):
    print(line, flush=True)


def want(step, arg=""):
    """Asks the test for `step` and returns what it answered."""
    say(f"want {step} {arg}".rstrip())
    answer = sys.stdin.readline().strip()
    if answer == "ok" or answer.startswith("ok "):
        return answer[3:]
    raise AssertionError(f"{step}: {answer or 'no answer'}")


def refreshed(page):
    return int(page.evaluate("Number(document.body.dataset.refreshed || 0)"))


def feed_open(page, limit_s=10.0):
    """Waits until the page's event feed is open: its first event refreshes the live part. Polled
    from here: the page's Content-Security-Policy refuses the eval Playwright's own polling needs."""
    deadline = time.monotonic() + limit_s
    while refreshed(page) < 1:
        assert time.monotonic() < deadline, "the page's event feed never opened"
        time.sleep(0.02)


def stay(page):
    page.evaluate("window.stayed = true")


def stayed(page):
    return page.evaluate("window.stayed === true")


def live(page, locator, what, limit_s=LIVE_S):
    """Waits for `locator` to show up without a reload, within `limit_s`."""
    start = time.monotonic()
    locator.wait_for(state="visible", timeout=limit_s * 1000)
    say(f"log {what} shown after {time.monotonic() - start:.3f} s")
    assert stayed(page), f"{what}: the page was reloaded"


SHOTS = None


def shot(page, name):
    """A screenshot of the page as the person sees it, when artifacts are kept."""
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, f"{name}.png"), full_page=True)


def notice(page):
    return page.locator(".notice.done")


def sign_in(page, url, token):
    page.goto(url + "/board")
    expect(page).to_have_url(url + "/sign-in")
    page.fill('input[name="token"]', "rlh_" + "0" * 64)
    page.click('button[type="submit"]')
    expect(page.locator(".notice.refused")).to_have_text("sign-in refused: unknown human token")
    page.fill('input[name="token"]', token)
    page.click('button[type="submit"]')
    expect(page).to_have_url(url + "/board")
    expect(page.locator("h1")).to_have_text("Board")
    cookie = next(c for c in page.context.cookies() if c["name"] == "relay_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict", cookie
    assert page.evaluate("document.cookie") == "", "the page's script cannot read the session"
    say("log signed in")


def board(page):
    feed_open(page)
    stay(page)
    before = refreshed(page)
    card = want("post-card")
    todo = page.locator(f'[data-column="todo"] [data-card="{card}"]')
    live(page, todo, "a card an agent posted")
    assert refreshed(page) > before
    # The agent's markup is text.
    expect(todo.locator("h3")).to_have_text("Ship the <b>login</b> page")
    assert todo.locator("h3 b").count() == 0

    want("to-review")
    review = page.locator(f'[data-column="review"] [data-card="{card}"]')
    live(page, review, "the card in Review")
    expect(page.locator(f'[data-column="todo"] [data-card="{card}"]')).to_have_count(0)
    expect(review).to_contain_text("done: see the branch")
    expect(review).to_contain_text("relay/" + card)
    review.get_by_role("button", name="Accept").click()
    expect(notice(page)).to_have_text("Card accepted: it is Done.")
    expect(page.locator(f'[data-column="done"] [data-card="{card}"]')).to_be_visible()
    expect(page.locator(f'[data-column="review"] [data-card="{card}"]')).to_have_count(0)
    want("check-done")
    shot(page, "board")
    say("log accepted a card")


def approval(page):
    page.click('nav a[href="/inbox"]')
    expect(page.locator("h1")).to_have_text("Inbox of me")
    feed_open(page)
    stay(page)
    asked = want("approval")
    request = page.locator(f'[data-approval="{asked}"]')
    live(page, request, "a permission request", limit_s=3.0)
    shot(page, "inbox-approval")
    expect(request.locator("pre.body")).to_contain_text("<script>alert(2)</script>")
    expect(page.locator('[data-message] pre.body', has_text="[Approval " + asked)).to_be_visible()
    expect(request).to_contain_text("waiting on you")
    request.get_by_role("button", name="Allow").click()
    expect(notice(page)).to_have_text("Permission allowed.")
    expect(page.locator(f'[data-approval="{asked}"]')).to_have_count(0)
    want("approval-decided")
    say("log allowed a permission request")


def messages(page, dialogs):
    feed_open(page)
    stay(page)
    hostile = "<script>alert(1)</script> hello from bob"
    sent = want("message", hostile)
    message = page.locator(f'[data-message="{sent}"]')
    live(page, message, "a message to me")
    expect(message.locator("pre.body")).to_have_text(hostile)
    assert message.locator("script").count() == 0
    assert dialogs == [], dialogs

    expect(message).to_have_class(re.compile(r"\bunread\b"))
    message.get_by_role("button", name="Mark read").click()
    expect(notice(page)).to_have_text("Marked read.")
    message = page.locator(f'[data-message="{sent}"]')
    expect(message).to_have_class(re.compile(r"\bread\b"))

    message.locator("summary", has_text="Reply").click()
    message.locator('textarea[name="body"]').fill("Thanks, bob")
    message.get_by_role("button", name="Send reply").click()
    expect(notice(page)).to_have_text("Reply sent.")
    want("check-reply", "Thanks, bob")

    page.locator("#send-message summary").click()
    page.fill('#send-message input[name="to"]', "laptop/bob")
    page.fill('#send-message textarea[name="body"]', "Hello from the console")
    page.locator("#send-message").get_by_role("button", name="Send").click()
    expect(notice(page)).to_have_text("Message sent.")
    want("bob-got", "Hello from the console")
    say("log read, replied and sent")


def hold(page):
    feed_open(page)
    stay(page)
    held = want("hold", "For eve across the contact")
    kept = page.locator(f'[data-hold="{held}"]')
    live(page, kept, "a held message", limit_s=3.0)
    shot(page, "inbox-hold")
    expect(kept.locator("pre.body")).to_have_text("For eve across the contact")
    kept.get_by_role("button", name="Release").click()
    expect(notice(page)).to_have_text("Hold released: the message was delivered.")
    want("hold-released", "For eve across the contact")
    say("log released a hold")


def post_and_edit(page):
    page.click('nav a[href="/board"]')
    page.locator("#post-card summary").click()
    page.fill('#post-card input[name="title"]', "Written on the page")
    page.fill('#post-card textarea[name="detail"]', "Detail from the person")
    page.select_option('#post-card select[name="requires_pr"]', "no")
    page.locator("#post-card").get_by_role("button", name="Post").click()
    expect(notice(page)).to_have_text("Card posted to To do.")
    card = page.locator('[data-column="todo"] article', has_text="Written on the page")
    expect(card).to_be_visible()
    expect(card).to_contain_text("acme/me")
    card.locator("summary", has_text="Edit").click()
    card.locator('input[name="title"]').fill("Edited on the page")
    card.get_by_role("button", name="Save").click()
    expect(notice(page)).to_have_text("Card edited.")
    expect(page.locator('[data-column="todo"] article', has_text="Edited on the page")).to_be_visible()
    shot(page, "board-edited")
    say("log posted and edited a card")


def agents(page):
    page.click('nav a[href="/agents"]')
    bob = page.locator('[data-agent="acme/laptop/bob"]')
    expect(bob).to_contain_text("online")
    expect(bob).to_contain_text("Building <the> login")
    expect(bob).to_contain_text("busy")
    expect(page.locator('[data-agent="globex/box/eve"]')).to_contain_text("online")
    shot(page, "agents")
    say("log saw the agents")


def activity(page, dialogs):
    """What the agents say to each other, the claims in force and who talked to whom, live; agents'
    text shown as text, private messages left out; the filters narrow it."""
    page.click('nav a[href="/activity"]')
    expect(page.locator("h1")).to_have_text("Activity")
    feed_open(page)
    stay(page)
    hostile = '<img src=x onerror="alert(7)"> hello amy <script>alert(8)</script>'
    want("agents-talk", hostile)
    thread = page.locator("details.thread", has_text="hello amy")
    live(page, thread, "a conversation between agents", limit_s=8.0)
    expect(thread.locator("pre.body").first).to_have_text(hostile)
    # The file bob attached, as a link that downloads it: bytes, never a page of the console's.
    link = thread.locator("ul.files a").first
    expect(link).to_have_text("plan & notes.md")
    with page.expect_download() as download:
        link.click()
    # The browser makes the name safe for a file system itself (Chromium: plan_b_.md).
    name = download.value.suggested_filename
    assert name.startswith("plan") and name.endswith(".md"), name
    with open(download.value.path(), "rb") as saved:
        assert saved.read() == b"step 1: <b>migrate</b>\n"
    expect(thread.locator("ul.files li").first).to_contain_text("23 B · text")
    expect(thread).to_contain_text("acme/laptop/bob → acme/ci/amy")
    expect(page.locator("details.thread", has_text="hi bob")).to_have_count(1)
    expect(page.locator("text=the private plan")).to_have_count(0)
    claim = page.locator("table.claims tr", has_text="acme/laptop/bob")
    expect(claim).to_contain_text("src/auth")
    expect(claim).to_contain_text("refactoring <b>login</b>")
    edge = page.locator('svg.graph line.edge[data-from="acme/laptop/bob"][data-to="acme/ci/amy"]')
    expect(edge).to_have_count(1)
    assert edge.get_attribute("data-count") == "2", edge.get_attribute("data-count")
    expect(page.locator('svg.graph g.agent[data-agent="acme/ci/amy"]')).to_have_count(1)
    expect(page.locator('svg.graph g.machine[data-machine="acme/laptop"]')).to_have_count(1)
    shot(page, "activity")
    page.fill('form.filters input[name="agent"]', "eve")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("details.thread")).to_have_count(0)
    page.fill('form.filters input[name="agent"]', "ci/amy")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("details.thread", has_text="hello amy")).to_have_count(1)
    page.fill('form.filters input[name="agent"]', "")
    page.fill('form.filters input[name="repo"]', "https://github.com/acme/API.git")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("table.claims tr", has_text="acme/laptop/bob")).to_have_count(1)
    expect(page.locator("details.thread", has_text="hello amy")).to_have_count(1)
    assert not any("7" in d or "8" in d for d in dialogs), dialogs
    say("log saw the agents' activity")


def contacts(page):
    page.click('nav a[href="/contacts"]')
    globex = page.locator('[data-contact="globex"]')
    expect(globex).to_contain_text("not allowed")
    globex.get_by_role("button", name="Allow").click()
    expect(notice(page)).to_have_text("Private data may now cross this contact.")
    expect(page.locator('[data-contact="globex"]').get_by_role("button", name="Forbid")).to_be_visible()
    page.fill('form[action="/contacts/request"] input[name="account"]', "initech")
    page.get_by_role("button", name="Request a contact").click()
    expect(notice(page)).to_have_text("Contact requested.")
    expect(page.locator('[data-contact="initech"]')).to_contain_text("you asked")
    shot(page, "contacts")
    page.locator('[data-contact="initech"] summary', has_text="Drop").click()
    page.locator('[data-contact="initech"]').get_by_role("button", name="Drop initech").click()
    expect(notice(page)).to_have_text("Contact dropped.")
    expect(page.locator('[data-contact="initech"]')).to_have_count(0)
    say("log managed contacts")


def sign_out(page, url):
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(url + "/sign-in")
    page.goto(url + "/inbox")
    expect(page).to_have_url(url + "/sign-in")
    say("log signed out")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--chromium", required=True)
    parser.add_argument("--artifacts", default=None)
    args = parser.parse_args()
    token = os.environ["RELAY_HUMAN_TOKEN"]
    global SHOTS
    SHOTS = args.artifacts

    with sync_playwright() as p:
        # Chromium's sandbox needs a user namespace, which a root CI container does not give.
        flags = ["--no-sandbox"] if os.geteuid() == 0 else []
        browser = p.chromium.launch(executable_path=args.chromium, args=flags)
        page = browser.new_page()
        page.set_default_timeout(10_000)
        expect.set_options(timeout=10_000)
        dialogs, blocked, failures = [], [], []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.on("pageerror", lambda e: failures.append(str(e)))
        page.on(
            "console",
            lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None,
        )
        try:
            sign_in(page, args.url, token)
            board(page)
            approval(page)
            messages(page, dialogs)
            hold(page)
            post_and_edit(page)
            agents(page)
            activity(page, dialogs)
            contacts(page)
            sign_out(page, args.url)
            assert dialogs == [], f"dialogs opened: {dialogs}"
            assert blocked == [], f"the Content-Security-Policy blocked: {blocked}"
            assert failures == [], f"the page's script failed: {failures}"
        except Exception:
            if args.artifacts:
                page.screenshot(path=os.path.join(args.artifacts, "failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    say("passed")


if __name__ == "__main__":
    main()
