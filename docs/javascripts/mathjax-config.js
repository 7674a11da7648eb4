// MathJax reads this before it loads (mkdocs.yml extra_javascript); pymdownx.arithmatex wraps formulas in
// \( … \) and \[ … \] inside elements of class "arithmatex".
window.MathJax = {
  tex: { inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]], processEscapes: true },
  options: { ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex", enableMenu: false },
  svg: { fontCache: "global" },
};
