// 收件箱网页的快捷键:a accept、e edit、r respond、i ignore、j / k 下一条 / 上一条。没有 JavaScript 时表单照样能用。
// 在文本框、输入框里打字时一个都不算;带 Ctrl / Alt / ⌘ 的组合键留给浏览器。
(function () {
  function typing(el) {
    return el && (el.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName));
  }
  function form(action) {
    return document.querySelector('form[data-action="' + action + '"]');
  }
  function rows() {
    return Array.prototype.slice.call(document.querySelectorAll("tr[data-ticket]"));
  }
  function move(step) {
    var nav = document.getElementById("nav");
    if (nav) {  // 工单页:去上一张 / 下一张
      var target = nav.dataset[step > 0 ? "next" : "prev"];
      if (target) location.href = "/tickets/" + encodeURIComponent(target);
      return;
    }
    var all = rows(), at = all.findIndex(function (r) { return r.classList.contains("selected"); });
    var next = all[Math.min(Math.max(at + step, 0), all.length - 1)];
    if (!next) return;
    all.forEach(function (r) { r.classList.remove("selected"); });
    next.classList.add("selected");
    next.scrollIntoView({block: "nearest"});
  }
  document.addEventListener("keydown", function (e) {
    if (typing(e.target) || e.ctrlKey || e.altKey || e.metaKey) return;
    var key = e.key;
    if (key === "j" || key === "k") { e.preventDefault(); move(key === "j" ? 1 : -1); return; }
    if (key === "Enter") {
      var picked = document.querySelector("tr.selected a");
      if (picked) { e.preventDefault(); picked.click(); }
      return;
    }
    var action = {a: "accept", e: "edit", r: "respond", i: "ignore"}[key];
    var f = action && form(action);
    if (!f) return;
    e.preventDefault();
    var box = f.querySelector("textarea");
    if (box) { box.focus(); return; }  // edit / respond:先写字,再点按钮(或 Ctrl+Enter)
    f.requestSubmit();
  });
  document.addEventListener("keydown", function (e) {  // 文本框里 Ctrl+Enter / ⌘+Enter 交表单
    if ((e.ctrlKey || e.metaKey) && e.key === "Enter" && e.target.tagName === "TEXTAREA" && e.target.form) {
      e.preventDefault();
      e.target.form.requestSubmit();
    }
  });
})();
