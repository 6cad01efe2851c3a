package bench.peers;

import java.util.Arrays;

/**
 * The exactly rounded sum of doubles (Shewchuk's partials, as Python's math.fsum), a port of
 * services/window-aggregator/src/exact_sum.rs so that price sums agree to the bit.
 */
final class ExactSum {
    double[] parts = new double[4];
    int size;
    boolean hasNonFinite;
    double nonFinite;

    void add(double value) {
        if (!Double.isFinite(value)) {
            nonFinite = hasNonFinite ? nonFinite + value : value;
            hasNonFinite = true;
            return;
        }
        double x = value;
        int kept = 0;
        for (int i = 0; i < size; i++) {
            double y = parts[i];
            if (Math.abs(x) < Math.abs(y)) {
                double t = x;
                x = y;
                y = t;
            }
            double high = x + y;
            double low = y - (high - x);
            if (low != 0.0) {
                parts[kept++] = low;
            }
            x = high;
        }
        size = kept;
        if (size == parts.length) {
            parts = Arrays.copyOf(parts, size * 2);
        }
        parts[size++] = x;
    }

    double value() {
        if (hasNonFinite) {
            return nonFinite;
        }
        if (size == 0) {
            return 0.0;
        }
        double high = parts[size - 1];
        double low = 0.0;
        int remaining = size - 1;
        while (remaining > 0) {
            remaining--;
            double x = high;
            double y = parts[remaining];
            high = x + y;
            low = y - (high - x);
            if (low != 0.0) {
                break;
            }
        }
        if (remaining > 0) {
            double next = parts[remaining - 1];
            if ((low < 0.0 && next < 0.0) || (low > 0.0 && next > 0.0)) {
                double doubled = low * 2.0;
                double candidate = high + doubled;
                if (doubled == candidate - high) {
                    high = candidate;
                }
            }
        }
        return high;
    }
}
