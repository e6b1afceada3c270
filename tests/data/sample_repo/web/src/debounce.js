/**
 * Delay calling fn until wait milliseconds have passed without another call,
 * e.g. to search only after the user stops typing.
 */
export function debounce(fn, wait) {
  let timer = null;
  return function debounced(...args) {
    clearTimeout(timer);
    timer = setTimeout(() => fn.apply(this, args), wait);
  };
}
