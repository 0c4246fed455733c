// <memfit-calculator model="meta-llama/Llama-3.1-8B" task="qlora" gpu="RTX4090-24GB" gpus="1">
// for documentation sites: one module script defines the element, which shows the embedded
// calculator (index.html?embed=1) in a frame sized to its content. The frame keeps the page's
// worker and storage rules working on any host site; the host styles it through CSS custom
// properties on the element (--memfit-accent, --memfit-bg, --memfit-card, --memfit-fg,
// --memfit-muted, --memfit-border, --memfit-font, --memfit-radius), forwarded to the frame.
const PAGE = new URL('./index.html', import.meta.url);
const SETUP = ['model', 'task', 'gpu', 'gpus', 'seq', 'precision', 'quant', 'mem', 'ibatch', 'ictx'];
const THEME = ['accent', 'bg', 'card', 'fg', 'muted', 'border', 'font', 'radius'];

class MemfitCalculator extends HTMLElement {
  static observedAttributes = SETUP;

  constructor() {
    super();
    const root = this.attachShadow({ mode: 'open' });
    const style = document.createElement('style');
    style.textContent = ':host { display: block; } iframe { display: block; width: 100%; border: 0; ' +
      'height: var(--memfit-height, 640px); border-radius: var(--memfit-radius, 12px); color-scheme: normal; }';
    this.frame = document.createElement('iframe');
    this.frame.title = 'memfit GPU memory calculator';
    this.frame.loading = 'lazy';
    root.append(style, this.frame);
    this.onMessage = (e) => {
      if (e.source !== this.frame.contentWindow || e.origin !== PAGE.origin || e.data?.memfit !== 'size') return;
      const height = Number(e.data.height);
      if (height > 0 && height < 20000) this.frame.style.height = `${height}px`;
    };
  }

  connectedCallback() {
    window.addEventListener('message', this.onMessage);
    this.load();
  }

  disconnectedCallback() {
    window.removeEventListener('message', this.onMessage);
  }

  attributeChangedCallback() {
    if (this.isConnected) this.load();
  }

  /** The embed URL for the element's attributes and the host's --memfit-* properties. */
  src() {
    const url = new URL(PAGE);
    url.searchParams.set('embed', '1');
    for (const name of SETUP) if (this.hasAttribute(name)) url.searchParams.set(name, this.getAttribute(name));
    const style = getComputedStyle(this);
    for (const name of THEME) {
      const value = style.getPropertyValue(`--memfit-${name}`).trim();
      if (value) url.searchParams.set(`theme-${name}`, value);
    }
    return url.href;
  }

  load() {
    const src = this.src();
    if (this.frame.src !== src) this.frame.src = src;
  }
}

if (!customElements.get('memfit-calculator')) customElements.define('memfit-calculator', MemfitCalculator);
