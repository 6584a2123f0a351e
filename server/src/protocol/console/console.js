// The Relay console's live pages. <body> names the events of /events after which its live part
// (#live) is fetched again from the server and swapped in: HTML the server rendered and escaped.
// Nothing else the server sends is ever run or parsed as markup.
(function () {
  'use strict';

  // Schedules are read in the zone of the person who posts them.
  for (const input of document.querySelectorAll('input[name="time_zone"]')) {
    try {
      input.value = Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC';
    } catch (e) {
      input.value = 'UTC';
    }
  }

  const body = document.body;
  const events = (body.dataset.live || '').split(' ').filter(Boolean);
  const fragment = body.dataset.fragment;
  const live = document.getElementById('live');
  if (!events.length || !fragment || !live || !window.EventSource) {
    return;
  }

  // How long one fetch of the live part may take before it is given up.
  const FETCH_LIMIT_MS = 15000;

  let busy = false;
  let again = false;
  let deferred = false;

  // A person typing in a form of the live part keeps it until they leave the field.
  function typing() {
    const active = document.activeElement;
    return active && live.contains(active) && (active.tagName === 'TEXTAREA' ||
      (active.tagName === 'INPUT' && !['hidden', 'submit', 'button', 'checkbox'].includes(active.type)));
  }

  async function refresh() {
    if (busy) {
      again = true;
      return;
    }
    if (typing()) {
      deferred = true;
      return;
    }
    busy = true;
    try {
      // A server that never answers must not hold every later refresh: the fetch gives up.
      const response = await fetch(fragment, {
        credentials: 'same-origin',
        cache: 'no-store',
        signal: AbortSignal.timeout(FETCH_LIMIT_MS),
      });
      if (response.status === 401) {
        location.assign('/sign-in');
        return;
      }
      if (response.ok) {
        const html = await response.text();
        // They may have started typing while the fragment was on its way: it waits for them.
        if (typing()) {
          deferred = true;
          return;
        }
        const open = Array.from(live.querySelectorAll('details[open][id]'), (d) => d.id);
        live.innerHTML = html;
        for (const id of open) {
          const details = document.getElementById(id);
          if (details) {
            details.open = true;
          }
        }
        body.dataset.refreshed = String(Number(body.dataset.refreshed || '0') + 1);
      }
    } catch (e) {
      // The next event tries again.
    } finally {
      busy = false;
    }
    if (again) {
      again = false;
      refresh();
    }
  }

  live.addEventListener('focusout', () => {
    if (deferred) {
      deferred = false;
      setTimeout(refresh, 0);
    }
  });

  const feed = new EventSource('/events');
  for (const name of events) {
    feed.addEventListener(name, refresh);
  }
  feed.addEventListener('signed-out', () => location.assign('/sign-in'));
})();
