package billing;

import java.math.BigDecimal;

/** A card processor that can charge and refund customers. */
public interface PaymentGateway {
    /** Charge the customer's card; returns a transaction id. */
    String charge(String customerId, BigDecimal amount);

    /** Refund a previous transaction in full. */
    void refund(String transactionId);
}
