const formatters = new Map();

/** Format a money amount for display, e.g. 1234.5 -> "$1,234.50". */
export const formatCurrency = (amount, currency = "USD", locale = "en-US") => {
  const key = `${locale}:${currency}`;
  if (!formatters.has(key)) {
    formatters.set(key, new Intl.NumberFormat(locale, { style: "currency", currency }));
  }
  return formatters.get(key).format(amount);
};
