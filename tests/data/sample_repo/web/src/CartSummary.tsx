import { formatCurrency } from "./formatCurrency";

type Line = { name: string; price: number; quantity: number };

export function CartSummary({ lines }: { lines: Line[] }) {
  const total = lines.reduce((sum, l) => sum + l.price * l.quantity, 0);
  return (
    <div className="cart">
      {lines.map((l) => (
        <p key={l.name}>
          {l.quantity} x {l.name}
        </p>
      ))}
      <strong>Total: {formatCurrency(total)}</strong>
    </div>
  );
}
