#include <stdexcept>
#include <vector>

class Matrix {
public:
    Matrix(size_t rows, size_t cols) : rows_(rows), cols_(cols), data_(rows * cols, 0.0) {}

    double &at(size_t r, size_t c) { return data_[r * cols_ + c]; }

    // Swap rows and columns.
    Matrix transpose() const {
        Matrix t(cols_, rows_);
        for (size_t r = 0; r < rows_; r++)
            for (size_t c = 0; c < cols_; c++)
                t.data_[c * rows_ + r] = data_[r * cols_ + c];
        return t;
    }

    // Matrix product; throws when the inner dimensions differ.
    Matrix multiply(const Matrix &o) const {
        if (cols_ != o.rows_) throw std::invalid_argument("shape mismatch");
        Matrix out(rows_, o.cols_);
        for (size_t i = 0; i < rows_; i++)
            for (size_t k = 0; k < cols_; k++)
                for (size_t j = 0; j < o.cols_; j++)
                    out.data_[i * o.cols_ + j] += data_[i * cols_ + k] * o.data_[k * o.cols_ + j];
        return out;
    }

private:
    size_t rows_, cols_;
    std::vector<double> data_;
};
