// The text every output shares (common/text_format.h): counts, FLOPs, bytes and times as `ablate
// expand`, `table`, `compare` and `report` print them, and the memory plan's messages.
#include "common/text_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

namespace ablate {
namespace {

TEST(FormatCountTest, Separators) {
  EXPECT_EQ(FormatCount(0), "0");
  EXPECT_EQ(FormatCount(999), "999");
  EXPECT_EQ(FormatCount(1000), "1,000");
  EXPECT_EQ(FormatCount(-57344), "-57,344");
  EXPECT_EQ(FormatCount(15577227264), "15,577,227,264");
}

TEST(FormatFlopsTest, ThreeDigitsInENotation) {
  EXPECT_EQ(FormatFlops(999), "999");
  EXPECT_EQ(FormatFlops(1234), "1.23e3");
  EXPECT_EQ(FormatFlops(2.1e21), "2.10e21");
  EXPECT_EQ(FormatFlops(3.4e8), "3.40e8");
  EXPECT_EQ(FormatFlops(4.23e11), "4.23e11");
}

TEST(FormatBytesTest, DecimalUnits) {
  EXPECT_EQ(FormatBytes(1.5e12), "1.50 TB");
  EXPECT_EQ(FormatBytes(80e9), "80.0 GB");
  EXPECT_EQ(FormatBytes(35.8e6), "35.8 MB");
  EXPECT_EQ(FormatBytes(200e6), "200.0 MB");
  EXPECT_EQ(FormatBytes(10000), "10.0 kB");
  EXPECT_EQ(FormatBytes(int64_t{512}), "512 B");
  EXPECT_EQ(FormatBytes(0), "0 B");
}

TEST(FormatDurationTest, SecondsMinutesHours) {
  EXPECT_EQ(FormatDuration(7), "7 s");
  EXPECT_EQ(FormatDuration(119), "119 s");
  EXPECT_EQ(FormatDuration(120), "2.0 min");
  EXPECT_EQ(FormatDuration(738), "12.3 min");
  EXPECT_EQ(FormatDuration(3600), "1.0 h");
  EXPECT_EQ(FormatDuration(14760), "4.1 h");
}

TEST(FormatDeviceTimeTest, HoursMinutesSeconds) {
  EXPECT_EQ(FormatDeviceTime(1500 * 3600.0), "1,500 device-hours");
  EXPECT_EQ(FormatDeviceTime(140048 * 3600.0), "140,048 device-hours");
  EXPECT_EQ(FormatDeviceTime(2.38 * 3600), "2.38 device-hours");
  EXPECT_EQ(FormatDeviceTime(90), "1.5 device-minutes");
  EXPECT_EQ(FormatDeviceTime(42), "42 device-seconds");
}

TEST(MeanStdTextTest, MeanWithItsDeviation) {
  EXPECT_EQ(MeanStdText(2.06174, 0.0132, 3), "2.062 ± 0.013");
  EXPECT_EQ(MeanStdText(2.06174, NAN, 3), "2.062");
  EXPECT_EQ(MeanStdText(NAN, NAN, 3), "—");
}

TEST(HumanCountTest, AsPapersPrintThem) {
  EXPECT_EQ(HumanCount(1.1e6), "1.10M");
  EXPECT_EQ(HumanCount(16400, /*sign=*/true), "+16.4K");
  EXPECT_EQ(HumanCount(512), "512");
  EXPECT_EQ(HumanCount(0, /*sign=*/true), "0");
}

}  // namespace
}  // namespace ablate
