// The embed loader, appended to the widget's wasm-bindgen glue by scripts/build-web; the
// whole file is one function scope, so loading it twice (two notebook cells) is harmless.
// It mounts a widget on every [data-stepstream-run] element, now and as they are added, and
// offers window.stepstream.chart(element, options) for pages that build elements themselves.
if (!(window.stepstream && window.stepstream.loaded)) {
  var script = document.currentScript;
  var src = script && script.src ? script.src : "";
  // The hub's address: where this script came from (a path prefix behind a proxy kept).
  var hub = src.replace(/embed\.js(\?.*)?$/, "").replace(/\/$/, "");
  var pending = [];
  var api = {
    loaded: true,
    hub: hub,
    widgets: new WeakMap(),
    // Mounts a widget; resolves to it (close(), state(), points()) once the module is in.
    chart: function (element, options) {
      return api.ready.then(function () {
        var w = wasm_bindgen.mount(element, options === undefined ? null : options, hub);
        api.widgets.set(element, w);
        return w;
      });
    },
    // Mounts any [data-stepstream-run] element not mounted yet.
    scan: function (root) {
      (root || document).querySelectorAll("[data-stepstream-run]").forEach(function (el) {
        if (!api.widgets.has(el)) {
          api.widgets.set(el, null);
          api.chart(el).catch(function (e) { console.warn("stepstream:", e); });
        }
      });
    },
    sockets: function () { return wasm_bindgen.sockets(); },
  };
  api.ready = wasm_bindgen({ module_or_path: hub + "/__WASM__" }).catch(function (e) {
    // Not even the module: say so in every box rather than leave it blank.
    document.querySelectorAll("[data-stepstream-run]").forEach(function (el) {
      el.setAttribute("data-state", "unreachable");
      el.textContent = "stepstream: cannot load the chart from " + hub + " (" + e + ")";
    });
    throw e;
  });
  window.stepstream = api;
  var start = function () {
    api.scan();
    new MutationObserver(function (changes) {
      changes.forEach(function (c) {
        c.addedNodes.forEach(function (n) {
          if (n.nodeType !== 1) return;
          if (n.matches("[data-stepstream-run]")) api.scan(n.parentNode);
          else api.scan(n);
        });
      });
    }).observe(document.documentElement, { childList: true, subtree: true });
    document.dispatchEvent(new CustomEvent("stepstream:ready"));
  };
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { api.ready.then(start); });
  } else {
    api.ready.then(start);
  }
}
