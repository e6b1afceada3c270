package billing;

import java.math.BigDecimal;
import java.math.RoundingMode;
import java.util.List;

/** Computes invoice totals with tax and discounts. */
public class InvoiceCalculator {
    private final BigDecimal taxRate;

    public InvoiceCalculator(BigDecimal taxRate) {
        this.taxRate = taxRate;
    }

    /** Sum of line amounts plus tax, rounded to cents. */
    public BigDecimal computeTotal(List<BigDecimal> lineAmounts) {
        BigDecimal subtotal = lineAmounts.stream().reduce(BigDecimal.ZERO, BigDecimal::add);
        BigDecimal tax = subtotal.multiply(taxRate);
        return subtotal.add(tax).setScale(2, RoundingMode.HALF_UP);
    }

    /** Apply a percentage discount, never going below zero. */
    public BigDecimal applyDiscount(BigDecimal total, int percent) {
        BigDecimal factor = BigDecimal.valueOf(100 - percent).divide(BigDecimal.valueOf(100));
        return total.multiply(factor).max(BigDecimal.ZERO).setScale(2, RoundingMode.HALF_UP);
    }
}
